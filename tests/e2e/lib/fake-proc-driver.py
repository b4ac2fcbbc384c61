#!/usr/bin/python3
# e2e rig only: an OCI createRuntime hook, installed in scenario 16's machine for podman (hooks.d)
# and containerd (base_runtime_spec). A real NVIDIA kernel module shows /proc/driver/nvidia/params
# in every procfs, so in every container; the rig's fake driver has no module, so a container's
# fresh procfs has no such file. This hook gives the container's /proc/driver what the machine's
# shows (a tmpfs copy of its /proc/driver/nvidia/params), before pivot_root and before any
# createContainer hook, so that a consumer's hook sees what it would see on a real node.
# Nothing happens when the machine has no /proc/driver/nvidia/params.
import json
import os
import subprocess
import sys

SRC = "/proc/driver/nvidia/params"
state = json.load(sys.stdin)
if not os.path.exists(SRC):
    sys.exit(0)
params = open(SRC).read()
with open(os.path.join(state["bundle"], "config.json")) as f:
    root = json.load(f)["root"]["path"]
if not os.path.isabs(root):
    root = os.path.join(state["bundle"], root)
script = ('set -e; d="$1/proc/driver"; mount -t tmpfs -o mode=755,size=64k e2e-proc-driver "$d"; '
          'mkdir "$d/nvidia"; cat > "$d/nvidia/params"; mount -o remount,ro,bind "$d" 2>/dev/null || true')
r = subprocess.run(["nsenter", "-t", str(state["pid"]), "-m", "sh", "-c", script, "sh", root],
                   input=params.encode(), capture_output=True)
if r.returncode != 0:
    sys.stderr.write("e2e fake-proc-driver: %s\n" % r.stderr.decode(errors="replace"))
    sys.exit(1)
