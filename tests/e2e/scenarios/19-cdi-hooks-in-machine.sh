# shellcheck shell=bash
# Scenario 19 (issue 11 items 3-5): the CDI spec's hooks run inside the machine, where there is no
# nvidia-cdi-hook. pre-start binds the helper read-only at the path the spec names; the machine's
# own runc (Debian 12's, which containerd brought) runs a container whose config.json carries the
# spec's "all" edits (nodes, the driver tmpfs and binds, the three createContainer hooks),
# applied here by a few lines of python as a CDI runtime applies them (the official CDI crate's
# injection is checked by tests/cdi.rs; podman and containerd's own injection by scenario 16). The
# image is a Debian-layout glibc rootfs with a stale libcuda.so.1 link from an older driver and an
# absolute link at libnvidia-ml.so.1 pointing at another file of the image. A probe linked against
# the image's glibc must dlopen both libraries by SONAME, see libcuda.so, and `ldconfig -p` in the
# container must list the driver; the image file behind the absolute link must be untouched.
scenario "CDI hooks run from the helper bound into the machine" --needs-helper
baseline
# A fresh start: baseline may have rewritten the host's stand-in binaries while kube1 ran, and a
# single-file bind of a replaced file cannot be bound again (mount(2) gives ENOENT; seen when this
# scenario followed scenario 1).
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile)" 0 "$rc"
assert_cmd "$(c machine-up)" wait_machine_up kube1 60

HOOK=/run/nspawn-lifecycle/nspawn-lifecycle-helper
R=$(mroot kube1)
B=/var/lib/e2e-cdihooks
ML=usr/lib/x86_64-linux-gnu

assert_match "$(c nspawn-binds-helper)" "^BindReadOnly=[^:]+:$HOOK\$" "$(nspawn_file kube1)"
assert_cmd "$(c hook-binary-runs-in-machine)" M "$HOOK" cdi-hook --help
err=$(M sh -c "echo x > $HOOK" 2>&1); rc=$?
assert_ne "$(c hook-binary-read-only)" 0 "$rc"
assert_match "$(c hook-binary-read-only-why)" 'Read-only file system' "$err"
info "writing the hook binary from the machine: $err"

tmp=$(mktemp -d)
cat > "$tmp/probe.c" <<'EOF'
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    const char *libs[2] = {"libcuda.so.1", "libnvidia-ml.so.1"};
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(libs[i], RTLD_NOW);
        if (h) printf("DLOPEN-OK %s\n", libs[i]);
        else printf("DLOPEN-FAIL %s %s\n", libs[i], dlerror());
    }
    printf("LIBCUDA-SO %s\n", access("/usr/lib/x86_64-linux-gnu/libcuda.so", F_OK) == 0 ? "yes" : "no");
    FILE *v = fopen("/victim", "r");
    char buf[64] = {0};
    if (v && fgets(buf, sizeof buf, v)) printf("VICTIM %s", buf);
    fflush(stdout);
    execl("/sbin/ldconfig", "ldconfig", "-p", (char *)0);
    return 1;
}
EOF
if gcc -O2 -o "$tmp/probe" "$tmp/probe.c"; then pass "$(c probe-built)"
else fail "$(c probe-built)" "gcc failed"; fi

# ---- the image: Debian layout, the machine's own glibc, a stale and an absolute link --------------
rm -rf "${R:?}$B"
mkdir -p "$R$B/rootfs/$ML" "$R$B/rootfs/lib64" "$R$B/rootfs/sbin" "$R$B/rootfs/etc/ld.so.conf.d" \
    "$R$B/rootfs/proc" "$R$B/rootfs/dev" "$R$B/rootfs/sys" "$R$B/rootfs/tmp"
cp "$R/$ML/libc.so.6" "$R/$ML/ld-linux-x86-64.so.2" "$R$B/rootfs/$ML/"
ln -s usr/lib "$R$B/rootfs/lib"
ln -s /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$R$B/rootfs/lib64/ld-linux-x86-64.so.2"
cp "$R/sbin/ldconfig" "$R$B/rootfs/sbin/"
install -m 0755 "$tmp/probe" "$R$B/rootfs/probe"
echo "include /etc/ld.so.conf.d/*.conf" > "$R$B/rootfs/etc/ld.so.conf"
echo "/usr/lib/x86_64-linux-gnu" > "$R$B/rootfs/etc/ld.so.conf.d/x86_64-linux-gnu.conf"
ln -s libcuda.so.470.57.02 "$R$B/rootfs/$ML/libcuda.so.1"
echo "image file" > "$R$B/rootfs/victim"
ln -s /victim "$R$B/rootfs/$ML/libnvidia-ml.so.1"
M ldconfig -r "$B/rootfs"

# ---- config.json: a minimal runtime config plus the spec's edits for "all" -----------------------
M cat "$CDI_SPEC" > "$tmp/spec.json"
if python3 - "$tmp/spec.json" > "$R$B/config.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
edits = [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"] if d["name"] == "all"]
cfg = {
    "ociVersion": "1.0.2",
    "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/probe"], "cwd": "/",
                "env": ["PATH=/usr/bin:/bin"],
                "capabilities": {k: ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_KILL"] for k in ("bounding", "effective", "permitted")},
                "noNewPrivileges": True},
    "root": {"path": "rootfs", "readonly": False},
    "hostname": "e2e-cdihooks",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    ],
    "hooks": {"createContainer": []},
    "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
              "devices": [], "resources": {"devices": [{"allow": False, "access": "rwm"}]}},
}
mounts = []
for e in edits:
    cfg["process"]["env"] += e.get("env", [])
    for n in e.get("deviceNodes", []):
        cfg["linux"]["devices"].append({"path": n["path"], "type": n["type"], "major": n["major"], "minor": n["minor"], "fileMode": 0o666})
        cfg["linux"]["resources"]["devices"].append({"allow": True, "type": n["type"], "major": n["major"], "minor": n["minor"], "access": "rwm"})
    for m in e.get("mounts", []):
        mounts.append({"destination": m["containerPath"], "source": m["hostPath"], "type": m.get("type", "bind"), "options": m.get("options", [])})
    for h in e.get("hooks", []):
        cfg["hooks"].setdefault(h["hookName"], []).append({k: h[k] for k in ("path", "args", "env") if k in h})
# As CDI does: by the number of path components, so the tmpfs comes before the binds under it.
cfg["mounts"] += sorted(mounts, key=lambda m: len([p for p in m["destination"].split("/") if p]))
json.dump(cfg, sys.stdout, indent=1)
PY
then pass "$(c config-written)"; else fail "$(c config-written)" "python failed"; fi

out=$(M timeout 60 runc --root /run/e2e-cdihooks run --no-new-keyring --bundle "$B" "cdihooks-$$" 2>&1); rc=$?
M runc --root /run/e2e-cdihooks delete -f "cdihooks-$$" >/dev/null 2>&1
info "runc in kube1: rc=$rc"
printf '%s\n' "$out" | sed 's/^/    /'
assert_eq "$(c runc-runs-container)" 0 "$rc"
assert_match "$(c dlopen-libcuda)" '^DLOPEN-OK libcuda\.so\.1$' "$out"
assert_match "$(c dlopen-libnvidia-ml)" '^DLOPEN-OK libnvidia-ml\.so\.1$' "$out"
assert_match "$(c libcuda-so-present)" '^LIBCUDA-SO yes$' "$out"
assert_match "$(c ldconfig-lists-libcuda)" 'libcuda\.so\.1 \(libc6,x86-64\) => /usr/lib/x86_64-linux-gnu/libcuda\.so\.1' "$out"
assert_match "$(c ldconfig-keeps-image-libc)" 'libc\.so\.6 \(libc6,x86-64\) => ' "$out"
assert_match "$(c absolute-link-target-untouched)" '^VICTIM image file$' "$out"
# The stale link was replaced in the container's rootfs, never followed (its target never made).
assert_eq "$(c stale-link-replaced)" "libcuda.so.$DRIVER_VERSION" "$(readlink "$R$B/rootfs/$ML/libcuda.so.1")"
assert_cmd "$(c stale-target-never-created)" test ! -e "$R$B/rootfs/$ML/libcuda.so.470.57.02"

rm -rf "$tmp" "${R:?}$B"
scenario_end
