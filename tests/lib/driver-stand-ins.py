#!/usr/bin/python3
"""Stand-ins for the driver root a CDI spec's mounts name: every hostPath under
/run/nvidia/driver/ made (firmware as a directory, every other one an empty file) below ROOT,
so a runtime can bind them. Used by tests/attack/run.sh and tests/bench/cdi-hooks.sh, which then
put gcc-built libraries with the real SONAMEs where a container loads them.

    driver-stand-ins.py SPEC ROOT      (ROOT "" means /)
"""
import json
import os
import sys

spec, root = json.load(open(sys.argv[1])), sys.argv[2]
for e in [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"]]:
    for m in e.get("mounts", []):
        h = m["hostPath"]
        if not h.startswith("/run/nvidia/driver/"):
            continue
        p = root + h
        if "/firmware/" in p:
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "a").close()
