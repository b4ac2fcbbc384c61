#!/usr/bin/python3
"""config.json for one case of the adversarial CDI-hook suite (tests/attack/run.sh).

    oci.py TEMPLATE OUT ROOTFS JSON-OPTIONS

TEMPLATE is `runc spec`'s default config. The product's CDI spec (options "cdi": its path) is
applied for the device "all" as a CDI runtime applies it: the spec's and the device's
containerEdits (env, device nodes, mounts, hooks) appended to the container's. Options:
  cdi        path of the CDI spec, or absent for a container without GPUs (the racer)
  args       the container's process
  env        extra process env ("K=V"), the image's ENV
  uid        the process's uid (0 unless given)
  volumes    [[machine dir, container path], ...] read-write binds
  fake_proc  a createRuntime hook giving the container's procfs the params a real NVIDIA kernel
             module shows (this rig has none): [path, args...]
  hook_env   "spec" (the hooks get the spec's env, as runc and crun pass it) or "container"
             (the env field dropped: a runtime that runs hooks with the container's environment,
             the worst case the hooks must survive)
"""
import json
import sys

template, out, rootfs, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
c = json.load(open(template))
c["root"] = {"path": rootfs, "readonly": False}
p = c["process"]
p["terminal"] = False
p["args"] = options["args"]
p["env"] = p.get("env", []) + options.get("env", [])
p["user"] = {"uid": options.get("uid", 0), "gid": options.get("uid", 0)}
# No network namespace setup to wait for; nothing here needs one of its own.
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "network"]
for src, dst in options.get("volumes", []):
    c["mounts"].append({"destination": dst, "type": "bind", "source": src, "options": ["rbind", "rw"]})
hooks = c.setdefault("hooks", {})
if "fake_proc" in options:
    fp = options["fake_proc"]
    hooks.setdefault("createRuntime", []).append({"path": fp[0], "args": fp})
if "cdi" in options:
    spec = json.load(open(options["cdi"]))
    edits = [spec.get("containerEdits", {})]
    edits += [d["containerEdits"] for d in spec["devices"] if d["name"] == "all"]
    res = c["linux"].setdefault("resources", {}).setdefault("devices", [])
    for e in edits:
        p["env"] += e.get("env", [])
        for n in e.get("deviceNodes", []):
            c["linux"].setdefault("devices", []).append(
                {"path": n["path"], "type": n["type"], "major": n["major"], "minor": n["minor"],
                 "fileMode": 0o666, "uid": 0, "gid": 0})
            res.append({"allow": True, "type": n["type"], "major": n["major"],
                        "minor": n["minor"], "access": "rwm"})
        for m in e.get("mounts", []):
            c["mounts"].append({"destination": m["containerPath"], "type": m.get("type", "bind"),
                                "source": m["hostPath"], "options": m.get("options", [])})
        for h in e.get("hooks", []):
            hook = {"path": h["path"], "args": h["args"]}
            if options.get("hook_env", "spec") == "spec" and "env" in h:
                hook["env"] = h["env"]
            hooks.setdefault(h["hookName"], []).append(hook)
json.dump(c, open(out, "w"), indent=1)
