#!/bin/bash
# What the CDI hooks add to every GPU container's creation, measured with a real runtime: the
# same bundle (the product's CDI spec applied for "all", a glibc image, a fresh rootfs each time)
# created, started and deleted by Debian 12's runc, interleaved over N rounds in these variants:
#   bare     the spec's edits without its hooks
#   ours     with our three hooks (HELPER cdi-hook create-symlinks, update-ldcache,
#            disable-device-node-modification)
#   old      the same hooks of a second helper (OLD, e.g. the build before a change), if given
#   nvidia   NVIDIA's nvidia-cdi-hook doing the same work (create-symlinks with the same links,
#            update-ldcache --folder for each library directory, disable-device-node-modification)
#            (NVIDIA_CDI_HOOK, else as tests/lib/nvidia-tools.sh finds it)
# Every variant also runs the createRuntime stand-in that gives the container's procfs NVIDIA's
# params (no kernel module here), so the params hooks do their real work; it costs all variants
# the same.
#
#   tests/bench/cdi-hooks.sh HELPER [OLD] [N]      N rounds (default 60), results on stdout
#
# Reported per variant: median and p90 of the whole create+start+delete in ms; for each hooked
# variant against bare: ratio of medians, median of the paired differences (round by round)
# and of the paired ratios. Runs in a private mount namespace; nothing of this host changes.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
die() { echo "cdi-hooks bench: $*" >&2; exit 1; }

if [ "${1:-}" != --inner ]; then
    HELPER=$(realpath "${1:?usage: tests/bench/cdi-hooks.sh HELPER [OLD] [N]}")
    OLD=${2:-}
    [ -z "$OLD" ] || OLD=$(realpath "$OLD")
    N=${3:-60}
    # shellcheck source=../lib/nvidia-tools.sh
    . "$ROOT/tests/lib/nvidia-tools.sh"
    NV=${NVIDIA_CDI_HOOK:-$(nvidia_tool nvidia-cdi-hook)} || exit 1
    [ "$(id -u)" = 0 ] || die "needs root"
    command -v runc >/dev/null || die "needs runc (tests/attack/fetch-runtimes.sh installs it)"
    exec unshare -m --propagation private "$0" --inner "$HELPER" "$OLD" "$N" "$(realpath "$NV")"
fi
HELPER=$2 OLD=$3 N=$4 NV=$5
W=$(mktemp -d /tmp/nspawn-lifecycle-bench-cdi.XXXXXX)
mount -t tmpfs -o size=1g bench "$W"
mount -t tmpfs -o size=64k,mode=755 nvidia-proc /proc/driver
mkdir /proc/driver/nvidia
printf 'ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n' >/proc/driver/nvidia/params
mount -t tmpfs -o mode=755 nvidia-run /run/nvidia 2>/dev/null || { mkdir -p /run/nvidia && mount -t tmpfs -o mode=755 nvidia-run /run/nvidia; }
SPEC=$ROOT/tests/golden/cdi-1gpu.json
# The driver root the spec's mounts name: stand-ins with the real SONAMEs, empty files elsewhere.
python3 "$ROOT/tests/lib/driver-stand-ins.py" "$SPEC" ""
ML=/usr/lib/x86_64-linux-gnu
echo 'int cuInit(unsigned f) { (void)f; return 4242; }' >"$W/cuda.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "/run/nvidia/driver$ML/libcuda.so.580.82.07" "$W/cuda.c"
printf 'int main(void) { return 0; }\n' >"$W/true.c"
gcc -static -O2 -o "$W/true" "$W/true.c"
# The image: a glibc rootfs with its own ldconfig and cache (NVIDIA's update-ldcache runs it).
IMG=$W/image
mkdir -p "$IMG"/{proc/driver/nvidia,dev,sys,tmp,etc/ld.so.conf.d,sbin,lib64,$ML}
for f in libc.so.6 ld-linux-x86-64.so.2 libdl.so.2 libm.so.6 libpthread.so.0 librt.so.1; do cp "$ML/$f" "$IMG$ML/"; done
ln -s "$ML/ld-linux-x86-64.so.2" "$IMG/lib64/ld-linux-x86-64.so.2"
cp /sbin/ldconfig "$IMG/sbin/ldconfig"
cp "$W/true" "$IMG/true"
echo "$ML" >"$IMG/etc/ld.so.conf.d/x86_64-linux-gnu.conf"
echo 'include /etc/ld.so.conf.d/*.conf' >"$IMG/etc/ld.so.conf"
ldconfig -r "$IMG"
cat >"$W/fake-proc" <<'EOF'
#!/bin/sh
pid=$(tr -d '\n' | sed -n 's/.*"pid"[[:space:]]*:[[:space:]]*\([0-9]*\).*/\1/p')
exec nsenter -t "$pid" -m sh -c 'mount -t tmpfs -o mode=755,size=64k p "$1/proc/driver" && mkdir "$1/proc/driver/nvidia" && cat /proc/driver/nvidia/params > "$1/proc/driver/nvidia/params"' sh "$1"
EOF
chmod +x "$W/fake-proc"
(cd "$W" && runc spec && mv config.json template.json)

python3 - "$W" "$SPEC" "$HELPER" "$OLD" "$NV" "$N" <<'EOF'
import json, os, shutil, statistics, subprocess, sys, time

W, SPEC, HELPER, OLD, NV, N = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
spec = json.load(open(SPEC))
tmpl = json.load(open(os.path.join(W, "template.json")))

def config(variant, rootfs):
    c = json.loads(json.dumps(tmpl))
    c["root"] = {"path": rootfs, "readonly": False}
    c["process"]["terminal"] = False
    c["process"]["args"] = ["/true"]
    c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "network"]
    hooks = {"createRuntime": [{"path": os.path.join(W, "fake-proc"), "args": ["fake-proc", rootfs]}]}
    ours = []
    for e in [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"] if d["name"] == "all"]:
        c["process"]["env"] += e.get("env", [])
        for n in e.get("deviceNodes", []):
            c["linux"].setdefault("devices", []).append({"path": n["path"], "type": "c", "major": n["major"], "minor": n["minor"], "fileMode": 0o666, "uid": 0, "gid": 0})
            c["linux"]["resources"]["devices"].append({"allow": True, "type": "c", "major": n["major"], "minor": n["minor"], "access": "rwm"})
        for m in e.get("mounts", []):
            c["mounts"].append({"destination": m["containerPath"], "type": m.get("type", "bind"), "source": m["hostPath"], "options": m.get("options", [])})
        ours += e.get("hooks", [])
    if variant in ("ours", "old"):
        path = HELPER if variant == "ours" else OLD
        hooks["createContainer"] = [dict(path=path, args=h["args"], **({"env": h["env"]} if "env" in h else {})) for h in ours]
    elif variant == "nvidia":
        links = [a for h in ours if h["args"][2] == "create-symlinks" for a in h["args"][3:] if a != "--link"]
        libs = [a.split("::")[1] for h in ours if h["args"][2] == "update-ldcache" for a in h["args"][3:] if a != "--lib"]
        folders = sorted({os.path.dirname(p) for p in libs})
        env = ["NVIDIA_CTK_DEBUG=false"]
        nv = [["nvidia-cdi-hook", "create-symlinks"] + [x for l in links for x in ("--link", l)],
              ["nvidia-cdi-hook", "update-ldcache"] + [x for f in folders for x in ("--folder", f)],
              ["nvidia-cdi-hook", "disable-device-node-modification"]]
        hooks["createContainer"] = [{"path": NV, "args": a, "env": env} for a in nv]
    c["hooks"] = hooks
    return c

variants = ["bare", "ours"] + (["old"] if OLD else []) + ["nvidia"]
bundles = {}
for v in variants:
    b = os.path.join(W, "b-" + v)
    os.makedirs(b)
    rootfs = os.path.join(b, "rootfs")
    json.dump(config(v, rootfs), open(os.path.join(b, "config.json"), "w"))
    bundles[v] = b

def once(v, i):
    b = bundles[v]
    rootfs = os.path.join(b, "rootfs")
    shutil.rmtree(rootfs, ignore_errors=True)
    subprocess.run(["cp", "-a", os.path.join(W, "image"), rootfs], check=True)
    cid = f"bench-{v}-{i}"
    rt = ["runc", "--root", os.path.join(W, "state")]
    t0 = time.perf_counter_ns()
    # Not pipes: the container's init inherits them and holds them open until it is deleted.
    with open(os.path.join(W, "runc.log"), "w+") as log:
        r = subprocess.run(rt + ["create", "--bundle", b, cid], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        if r.returncode != 0:
            log.seek(0)
            sys.exit(f"{v}: runc create failed: {log.read()}")
        subprocess.run(rt + ["start", cid], check=True, stdout=log, stderr=log)
        subprocess.run(rt + ["delete", "-f", cid], check=True, stdout=log, stderr=log)
    t1 = time.perf_counter_ns()
    # The hooks did their work: the cache lists the driver, the links exist.
    if v != "bare":
        cache = open(os.path.join(rootfs, "etc/ld.so.cache"), "rb").read()
        if b"libcuda.so.1" not in cache or not os.path.islink(os.path.join(rootfs, "usr/lib/x86_64-linux-gnu/libcuda.so.1")):
            sys.exit(f"{v}: the hooks did not do their work")
    return (t1 - t0) / 1e6

for v in variants:  # warm-up, not counted
    once(v, "warm")
times = {v: [] for v in variants}
for i in range(N):
    order = variants[i % len(variants):] + variants[:i % len(variants)]
    for v in order:
        times[v].append(once(v, i))

def p90(xs):
    return sorted(xs)[int(0.9 * (len(xs) - 1))]

med = {v: statistics.median(times[v]) for v in variants}
print(f"# CDI hooks per container creation: runc {subprocess.run(['runc', '--version'], capture_output=True, text=True).stdout.split()[2]}, N={N} interleaved rounds, create+start+delete")
print("| variant | median ms | p90 ms | added vs bare (ratio of medians) | paired median added ms | paired median ratio |")
print("|---|---:|---:|---:|---:|---:|")
for v in variants:
    if v == "bare":
        print(f"| bare | {med[v]:.1f} | {p90(times[v]):.1f} | | | |")
        continue
    diffs = [a - b for a, b in zip(times[v], times["bare"])]
    ratios = [a / b for a, b in zip(times[v], times["bare"])]
    print(f"| {v} | {med[v]:.1f} | {p90(times[v]):.1f} | {med[v] - med['bare']:+.1f} ms ({med[v] / med['bare']:.3f}) | {statistics.median(diffs):+.1f} | {statistics.median(ratios):.3f} |")
ours_add = statistics.median([a - b for a, b in zip(times["ours"], times["bare"])])
nv_add = statistics.median([a - b for a, b in zip(times["nvidia"], times["bare"])])
print(f"\nours adds {ours_add:.1f} ms per creation (paired median); NVIDIA's hooks add {nv_add:.1f} ms; ours / NVIDIA's = {ours_add / nv_add:.2f}")
print("raw: " + json.dumps({v: [round(t, 2) for t in times[v]] for v in variants}))
EOF
