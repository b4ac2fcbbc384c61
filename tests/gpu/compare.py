#!/usr/bin/python3
"""Our discovery beside NVIDIA's view of the same host (tests/gpu/run.sh, check 1).

    compare.py DISCOVER_JSON NVIDIA_SMI_Q CDI_SPEC [--driver-root DIR]

DISCOVER_JSON  `nspawn-lifecycle-helper discover --json` on the host
NVIDIA_SMI_Q   `nvidia-smi -q` on the host (what the kernel driver and NVML report)
CDI_SPEC       `nvidia-ctk cdi generate --mode=nvml --format=json` on the host (on a host with no
               GPU, tests/gpu/selftest.sh gives `--mode=management` output instead)
--driver-root  the prefix nvidia-ctk's host paths carry (its --driver-root), stripped before
               comparing; `/` (nothing stripped) by default

Prints one line per check ("PASS …" / "FAIL …") and one line per difference between the two
file lists, each with the reason it is expected ("explained: …") or "UNEXPLAINED". Exit 0 when
every check passed and no difference is unexplained, 1 otherwise, 2 on bad input.
Python 3 standard library only: the GPU host has python3 and nothing else of ours.
"""
import json
import os
import re
import sys

# Differences that are expected, with the reason: (kind, side, name pattern, why).
EXPLAINED = [
    ("library", "only ours", r"libnvidia-api\.so\.1",
     "nvidia-ctk lists libnvidia-api.so only in an optional, feature-flagged set; it is a driver "
     "library and we carry every one"),
    ("library", "only ours", r"libnvidia-egl-(gbm|wayland|wayland2|xcb|xlib)\.so\..*",
     "EGL platform libraries (their own version numbers): we carry every file the driver ships; "
     "nvidia-ctk mounts them only in some modes"),
    ("library", "only nvidia-ctk", r"(libglxserver_nvidia\.so.*|nvidia_drv\.so)",
     "X server modules: the X server's, not a container's; the machine runs no X server"),
    ("config", "only nvidia-ctk", r".*",
     "graphics configuration (EGL/Vulkan/GLX vendor files, nvoptix.bin): not carried, the node "
     "runs compute workloads (tests/README.md, 'Our discover --json against nvidia-ctk')"),
    ("device", "only ours", r"/dev/nvidia-caps/.*|/dev/nvidia-caps-imex-channels/.*",
     "MIG and IMEX capability nodes: bound into the machine for MIG and multi-node NVLink; "
     "nvidia-ctk's nvml mode names them only for MIG devices"),
]

BIN_DIRS = ("bin", "sbin")


def die(msg):
    print(f"compare.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        die(f"{path}: {e}")


def bus_id(text):
    """`00000000:3B:00.0` (nvidia-smi) or `0000:3b:00.0` (sysfs) as one comparable value."""
    m = re.fullmatch(r"([0-9A-Fa-f]+):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])", text.strip())
    if not m:
        return None
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4)))


def smi_gpus(path):
    """Driver version and {uuid: (bus id, minor, name)} from `nvidia-smi -q`."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        die(f"{path}: {e}")
    version, gpus, cur = None, {}, None
    for line in lines:
        m = re.match(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", line)
        if m:
            cur = {"bus": bus_id(m.group(1))}
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "Driver Version" and version is None:
            version = value
        elif cur is not None and key == "Product Name" and "name" not in cur:
            cur["name"] = value
        elif cur is not None and key == "GPU UUID":
            cur["uuid"] = value
        elif cur is not None and key == "Minor Number" and "minor" not in cur:
            cur["minor"] = int(value) if value.isdigit() else None
            if "uuid" in cur:
                gpus[cur["uuid"]] = cur
                cur = None
    if not gpus:
        die(f"{path}: no GPU in this nvidia-smi -q output")
    return version, gpus


def basename(p):
    return p.rstrip("/").rsplit("/", 1)[-1]


def theirs(spec, root):
    """nvidia-ctk's spec as sets (device nodes, libraries, binaries, firmware, sockets, configs),
    its host paths taken relative to `root`, and the host paths it names outside `root`."""
    s = {k: set() for k in ("device", "library", "binary", "firmware", "socket", "config")}
    outside = []

    def rel(host):
        if root == "/":
            return host
        if host.startswith(root + "/"):
            return host[len(root):]
        outside.append(host)
        return None

    edits = [spec.get("containerEdits") or {}]
    edits += [(d.get("containerEdits") or {}) for d in spec.get("devices", [])]
    for e in edits:
        for n in e.get("deviceNodes") or []:
            # nvidia-ctk takes device nodes from the dev root, which may lie outside the driver root.
            node = n.get("hostPath") or n["path"]
            s["device"].add(node[len(root):] if root != "/" and node.startswith(root + "/") else node)
        for m in e.get("mounts") or []:
            host = rel(m["hostPath"])
            if host is None:
                continue
            parent = host.rsplit("/", 1)[0]
            if "/firmware/" in host:
                s["firmware"].add(basename(host))
            elif host.endswith("/socket"):
                s["socket"].add(host)
            elif basename(parent) in BIN_DIRS:
                s["binary"].add(basename(host))
            elif re.search(r"\.so(\.[0-9.]+)?$", host):
                s["library"].add(basename(host))
            else:
                s["config"].add(host)
    return s, outside


def ours(d, root):
    s = {k: set() for k in ("device", "library", "binary", "firmware", "socket", "config")}
    # Every node discovery found, DRM nodes of the GPUs included.
    for n in d.get("devices", []):
        s["device"].add(n["path"])
    drv = d.get("driver") or {}
    for lib_dir in drv.get("libDirs", []):
        for f in lib_dir.get("files", []):
            s["library"].add(basename(f["name"]))
    for b in drv.get("binaries", []):
        s["binary"].add(basename(b))
    fw = drv.get("firmware")
    if fw:
        try:
            for name in os.listdir((root.rstrip("/") or "") + fw):
                s["firmware"].add(name)
        except OSError as e:
            print(f"FAIL the firmware directory discover names ({fw}) cannot be listed: {e}")
    for sock in drv.get("sockets", []):
        s["socket"].add(f"{sock}/socket")
    return s


def explain(kind, side, name):
    for k, sd, pat, why in EXPLAINED:
        if k == kind and sd == side and re.fullmatch(pat, name):
            return why
    return None


def main(argv):
    root = "/"
    args = list(argv)
    if "--driver-root" in args:
        i = args.index("--driver-root")
        if i + 1 >= len(args):
            die("--driver-root needs a directory")
        root = args[i + 1].rstrip("/") or "/"
        del args[i:i + 2]
    if len(args) != 3:
        die("usage: compare.py DISCOVER_JSON NVIDIA_SMI_Q CDI_SPEC [--driver-root DIR]")
    d = load_json(args[0])
    version, smi = smi_gpus(args[1])
    spec = load_json(args[2])
    failed = 0

    def check(ok, what):
        nonlocal failed
        print(("PASS " if ok else "FAIL ") + what)
        failed += 0 if ok else 1

    state = (d.get("verdict") or {}).get("state")
    check(state == "complete", f"discover's verdict is complete (it is {state!r})")
    found = {g["uuid"]: g for g in d.get("gpus", [])}
    check(set(found) == set(smi),
          f"discover finds the GPUs nvidia-smi lists: {len(found)} vs {len(smi)} "
          f"(only discover: {sorted(set(found) - set(smi))}, only nvidia-smi: {sorted(set(smi) - set(found))})")
    for uuid in sorted(set(found) & set(smi)):
        g, s = found[uuid], smi[uuid]
        check(bus_id(g.get("busId", "")) == s["bus"] and g.get("minor") == s.get("minor"),
              f"{uuid}: bus id {g.get('busId')} and minor {g.get('minor')} as nvidia-smi says "
              f"({s['bus']}, minor {s.get('minor')}, {s.get('name')})")
    drv = d.get("driver") or {}
    check(d.get("kernelModule") == version and drv.get("version") == version,
          f"driver version: kernel module {d.get('kernelModule')}, userspace {drv.get('version')}, "
          f"nvidia-smi {version}")
    roles = {n.get("role") for n in d.get("devices", [])}
    check({"control", "uvm", "uvm-tools"} <= roles,
          f"the control nodes (nvidiactl, nvidia-uvm, nvidia-uvm-tools) are found: roles {sorted(r for r in roles if r)}")
    where = sorted({l["path"] for l in drv.get("libDirs", [])})
    print(f"INFO driver libraries found in {where}; binaries {drv.get('binaries')}; firmware {drv.get('firmware')}")

    a, (b, outside) = ours(d, root), theirs(spec, root)
    check(not outside, f"nvidia-ctk mounts nothing from outside its driver root {root}: {outside}")
    check(len(b["library"]) > 0, f"nvidia-ctk's spec mounts driver libraries ({len(b['library'])})")
    unexplained = 0
    for kind in ("device", "library", "binary", "firmware", "socket", "config"):
        both = a[kind] & b[kind]
        print(f"INFO {kind}: {len(both)} in both")
        for side, names in (("only ours", a[kind] - b[kind]), ("only nvidia-ctk", b[kind] - a[kind])):
            for name in sorted(names):
                why = explain(kind, side, name)
                if why:
                    print(f"DIFF {kind} {side}: {name}: explained: {why}")
                else:
                    print(f"DIFF {kind} {side}: {name}: UNEXPLAINED")
                    unexplained += 1
    check(unexplained == 0, f"every difference from nvidia-ctk is explained ({unexplained} unexplained)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
