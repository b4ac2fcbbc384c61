# Scenario 16 (issue 11, "Real consumers"): real container engines inside the machine consume the
# product's CDI spec. In kube2 (so kube1 keeps Debian's containerd 1.6 for the other scenarios):
# podman 4.3.1 with runc and with crun (bookworm), and containerd 1.7 (trixie) through its CRI plugin
# with enable_cdi, driven by a small CRI client (lib/cri-run.py; ctr has no CDI). Local images only
# (lib/engines.sh builds them on the outer machine): (a) Debian layout, (b) /usr/lib64 layout
# (Debian's libc6-amd64:i386 glibc: its loader never searches /usr/lib/x86_64-linux-gnu), (c) Debian
# layout with a stale `libcuda.so.1 -> libcuda.so.470.57.02` link. In each container a test program
# dlopen()s libcuda.so.1, libnvidia-ml.so.1 and libcuda.so and calls cuInit/nvmlInit_v2: a returned
# error code (no kernel driver here) proves the real library was loaded and ran.
# Checks per run (names s16.<engine>.<image>.<device>.<what>): the container starts; it sees exactly
# its GPUs' nodes with the right major:minor; the device cgroup lets it open its own node (ENXIO)
# and refuses another GPU's (EPERM; runc and CRI: crun runs without cgroups here, see below); the
# real libcuda and libnvidia-ml load by SONAME, and libcuda.so; `ldconfig -p` lists both SONAMEs;
# /proc/driver/nvidia/params says ModifyDeviceFiles: 0 (the fake host has the file with 1).
# Then NVIDIA's own tools, copied into the machine for the test only: `nvidia-ctk cdi list` lists
# every device of our spec; our /dev/char links equal `nvidia-ctk system create-dev-char-symlinks`.
# The real driver files come from E2E_REAL_DRIVER_ROOT (harness.sh: stage_real_driver); without
# them the library checks run against the stubs and the cuInit checks fail, as they must.
# Rig limit (shared/research/ENGINES-IN-MACHINE.md pitfall 3): the workplace has no
# CAP_SYS_RESOURCE, so crun cannot raise RLIMIT_MEMLOCK to load its device eBPF program; crun runs
# with --cgroups=disabled (no device cgroup), everything else about it is real. containerd's CRI
# always sets cpu shares, and this VM's machine has no cgroup controllers: runc is reached through
# a rig-only wrapper that drops linux.resources (pitfall 2). No kernel module: the fake
# /proc/driver/nvidia/params is put into the machine's /proc and, by a rig-only createRuntime hook
# (lib/fake-proc-driver.py), into each container's fresh procfs, as a real module would show it.
scenario "real engines (podman 4.3.1 crun/runc, containerd 1.7 CRI) run CUDA-loading containers with our CDI spec" --needs-helper
# shellcheck source=../lib/engines.sh
. "$E2E_SRC/lib/engines.sh"

baseline || exit 0
EM=kube2
NGPU=$E2E_GPUS
# shellcheck source=../../lib/nvidia-tools.sh
. "$E2E_SRC/../lib/nvidia-tools.sh"
CTK_DIR=${E2E_NVIDIA_CTK_DIR:-$(dirname "$(nvidia_tool nvidia-ctk)")}

# ---- the driver under test: the real userspace when staged ------------------------------------
REALV=$(H sh -c 'for d in /opt/e2e-fake-driver/*/; do [ -e "$d.real" ] && basename "$d"; done; true' | head -1)
if [ -n "$REALV" ]; then
    fake_driver_version "$REALV"
    # However this scenario ends, the rig goes back to the stub driver and both machines stop (their
    # binds are the real driver's files): the next scenario's result stays its own.
    trap 'stop_unit "$EM" >/dev/null 2>&1; fake_driver_version "$DRIVER_VERSION"; stop_unit kube1 >/dev/null 2>&1' EXIT
    DV=$REALV
    pass "$(c real-driver-files)"
    info "real NVIDIA userspace $REALV in the fake host ($(H sh -c "ls /usr/lib/x86_64-linux-gnu/*.so.$REALV | wc -l") libraries)"
else
    DV=$DRIVER_VERSION
    fail "$(c real-driver-files)" "no real driver in the fake host (E2E_REAL_DRIVER=0, or neither tests/realdriver/fetch.sh nor E2E_REAL_DRIVER_ROOT): libraries are stubs, cuInit cannot be called"
fi
assert_eq "$(c fake-host-params)" "ModifyDeviceFiles: 1" "$(H grep ModifyDeviceFiles /proc/driver/nvidia/params 2>&1)"

# ---- packages, images, CRI stubs (outer machine, cached) --------------------------------------
t0=$(now_ms)
if ! prep_out=$(engines_prepare 2>&1); then
    fail "$(c engines-prepared)" "$prep_out"; exit 0
fi
pass "$(c engines-prepared)"
info "engines prepared in $(( $(now_ms) - t0 )) ms: $(printf '%s' "$prep_out" | tail -1)"

# ---- kube2 with the product, and the engines in it --------------------------------------------
out=$(helper install "$EM" 2>&1) || { fail "$(c install-$EM)" "$out"; exit 0; }
start_unit "$EM" >/dev/null 2>&1
if ! wait_machine_up "$EM" 120; then
    fail "$(c $EM-up)" "$(uprop ActiveState "$EM")/$(uprop SubState "$EM")"; exit 0
fi
pass "$(c $EM-up)"
MR=$(mroot "$EM")
t0=$(now_ms)
rm -rf "$MR/root/e2e-engines"; mkdir -p "$MR/root/e2e-engines"
cp -a "$ENG_CACHE/machine/." "$MR/root/e2e-engines/"
install -m755 "$E2E_SRC/lib/cri-run.py" "$MR/root/e2e-engines/cri/cri-run.py"
install -m755 "$CTK_DIR/nvidia-ctk" "$MR/root/e2e-engines/nvidia-ctk"
# /proc/driver/nvidia/params as a real kernel module shows it in every procfs: in the machine
# (a tmpfs over its /proc/driver, filled from the fake host's) and, through a rig-only
# createRuntime hook (lib/fake-proc-driver.py), in every container's fresh procfs
mkdir -p "$MR/usr/local/lib/e2e" "$MR/etc/containers/oci/hooks.d"
install -m755 "$E2E_SRC/lib/fake-proc-driver.py" "$MR/usr/local/lib/e2e/fake-proc-driver"
printf '{"version":"1.0.0","hook":{"path":"/usr/local/lib/e2e/fake-proc-driver"},"when":{"always":true},"stages":["createRuntime"]}\n' \
    > "$MR/etc/containers/oci/hooks.d/00-e2e-fake-proc-driver.json"
H cat /proc/driver/nvidia/params | Mi -m "$EM" sh -c 'mountpoint -q /proc/driver || mount -t tmpfs -o mode=755,size=64k e2e-proc-driver /proc/driver; mkdir -p /proc/driver/nvidia; cat > /proc/driver/nvidia/params'
assert_eq "$(c machine-params)" "ModifyDeviceFiles: 1" "$(M -m "$EM" grep ModifyDeviceFiles /proc/driver/nvidia/params 2>&1)"
# podman's settings before its first call (pitfalls 2 and 4: vfs on the overlay rootfs, no pids
# controller); CRI: containerd 1.7's config and the rig-only runc wrapper
mkdir -p "$MR/etc/containers" "$MR/etc/containerd" "$MR/usr/local/sbin"
printf '[storage]\ndriver = "vfs"\nrunroot = "/run/containers/storage"\ngraphroot = "/var/lib/containers/storage"\n' \
    > "$MR/etc/containers/storage.conf"
printf '[containers]\npids_limit = 0\n\n[engine]\nruntime = "runc"\nhooks_dir = ["/etc/containers/oci/hooks.d"]\n' > "$MR/etc/containers/containers.conf"
cat > "$MR/usr/local/sbin/runc-nocpu" <<'EOF'
#!/bin/sh
# e2e rig only (ENGINES-IN-MACHINE.md pitfall 2): the machine has no cgroup controllers on these
# VMs, and containerd's CRI always sets cpu shares; drop linux.resources' cpu/pids/memory on create.
b=
prev=
for a in "$@"; do [ "$prev" = --bundle ] && b=$a; prev=$a; done
case " $* " in *" create "*) [ -n "$b" ] && python3 -c '
import json, sys
p = sys.argv[1] + "/config.json"; s = json.load(open(p))
r = s.get("linux", {}).get("resources", {})
for k in ("cpu", "pids", "memory"): r.pop(k, None)
json.dump(s, open(p, "w"))' "$b";; esac
exec /usr/sbin/runc "$@"
EOF
chmod 755 "$MR/usr/local/sbin/runc-nocpu"
cat > "$MR/etc/containerd/config.toml" <<'EOF'
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  restrict_oom_score_adj = true
  sandbox_image = "registry.k8s.io/pause:3.8"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "/etc/containerd/e2e-base-spec.json"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/local/sbin/runc-nocpu"
        SystemdCgroup = false
EOF
out=$(M -m "$EM" sh -c '/root/e2e-engines/install.sh 2>&1 && ctr oci spec > /etc/containerd/e2e-base-spec.json && python3 -c "
import json; p = \"/etc/containerd/e2e-base-spec.json\"; s = json.load(open(p))
s.setdefault(\"hooks\", {})[\"createRuntime\"] = [{\"path\": \"/usr/local/lib/e2e/fake-proc-driver\"}]
json.dump(s, open(p, \"w\"))" && systemctl restart containerd 2>&1') \
    && pass "$(c packages-installed)" || fail "$(c packages-installed)" "$(printf '%s' "$out" | tail -5)"
info "copy + dpkg of $(ls "$ENG_CACHE/machine/debs" | grep -c '\.deb$') packages in $EM: $(( $(now_ms) - t0 )) ms"
assert_match "$(c podman-4.3.1)" '^podman version 4\.3\.1' "$(M -m "$EM" podman --version 2>&1)"
assert_match "$(c containerd-1.7)" 'containerd .* 1\.7\.' "$(M -m "$EM" containerd --version 2>&1)"
assert_match "$(c crun-present)" '^crun version' "$(M -m "$EM" crun --version 2>&1 | head -1)"
wait_until 30 inner_active containerd.service "$EM"
t0=$(now_ms)
out=""
for i in debian lib64 stale; do
    out+=$(M -m "$EM" podman import -q "/root/e2e-engines/images/$i.tar" "localhost/e2e-$i:1" 2>&1 >/dev/null)
    out+=$(M -m "$EM" ctr -n k8s.io images import --snapshotter native "/root/e2e-engines/images/$i-oci.tar" 2>&1 >/dev/null)
done
out+=$(M -m "$EM" ctr -n k8s.io images import --snapshotter native /root/e2e-engines/images/pause-oci.tar 2>&1 >/dev/null)
[ -z "$out" ] && pass "$(c images-imported)" || fail "$(c images-imported)" "$out"
info "images imported (podman, containerd k8s.io) in $(( $(now_ms) - t0 )) ms"

# ---- the probe run in every container ----------------------------------------------------------
# prints NODE <path> <maj:min hex>, then cudaprobe's DLOPEN/CALL lines, LDCACHE lines, PARAMS, and
# OWN/OTHER: what open(2) of its own GPU node and of a node it made for a GPU not granted says.
# shellcheck disable=SC2016
PROBE='for f in /dev/nvidia* /dev/dri/*; do [ -c "$f" ] && echo "NODE $f $(stat -c %t:%T "$f")"; done
/usr/local/bin/cudaprobe
ldconfig -p 2>&1 | grep -E "libcuda\.so\.1|libnvidia-ml\.so\.1" | sed "s/^/LDCACHE /"
echo "PARAMS $(grep ModifyDeviceFiles /proc/driver/nvidia/params 2>&1)"
if [ -n "$OWN" ]; then echo "OWN $(cat "$OWN" 2>&1 >/dev/null)"; fi
echo "OTHER $(mknod /tmp/other c 195 "$OTHER" 2>&1 && cat /tmp/other 2>&1 >/dev/null)"
echo PROBE-DONE'
HEXUVM=$(H awk '$2 == "nvidia-uvm" {printf "%x", $1}' /proc/devices)

# check_run <engine> <image> <device> <gpu indexes> <rc> <output>
check_run() {
    local e=$1 img=$2 dev=$3 gpus=$4 rc=$5 o=$6 n=$e.$2.$3 want got i p
    [ ${#dev} -gt 12 ] && n=$e.$img.uuid
    if [ "$rc" != 0 ] || ! grep -q '^PROBE-DONE' <<<"$o"; then
        fail "$(c "$n.started")" "exit $rc: $(printf '%s' "$o" | tail -4)"; return
    fi
    pass "$(c "$n.started")"
    want=""; for i in $gpus; do want+="/dev/nvidia$i c3:$(printf %x "$i") "; done
    got=$(printf '%s\n' "$o" | awk '$1 == "NODE" && $2 ~ /^\/dev\/nvidia[0-9]+$/ {printf "%s %s ", $2, $3}')
    assert_eq "$(c "$n.gpu-nodes-exactly")" "$want" "$got"
    want=$(printf '%s\n' "/dev/nvidiactl c3:ff" "/dev/nvidia-uvm $HEXUVM:0" "/dev/nvidia-uvm-tools $HEXUVM:1" | LC_ALL=C sort | tr '\n' ' ')
    got=$(printf '%s\n' "$o" | awk '$1 == "NODE" && $2 ~ /^\/dev\/nvidia(ctl|-uvm|-uvm-tools)$/ {print $2, $3}' | LC_ALL=C sort | tr '\n' ' ')
    assert_eq "$(c "$n.control-nodes")" "$want" "$got"
    want=""; for i in $gpus; do want+="/dev/dri/card$((i + 1)) e2:$(printf %x $((i + 1))) "; done
    for i in $gpus; do want+="/dev/dri/renderD$((128 + i)) e2:$(printf %x $((128 + i))) "; done
    got=$(printf '%s\n' "$o" | awk '$1 == "NODE" && $2 ~ /^\/dev\/dri\/card/ {printf "%s %s ", $2, $3}')
    got+=$(printf '%s\n' "$o" | awk '$1 == "NODE" && $2 ~ /^\/dev\/dri\/renderD/ {printf "%s %s ", $2, $3}')
    assert_eq "$(c "$n.dri-nodes-exactly")" "$want" "$got"
    if [ "$e" != podman-crun ]; then
        assert_match "$(c "$n.own-node-allowed")" '^OWN .*No such device or address' "$(printf '%s\n' "$o" | grep '^OWN')"
        assert_match "$(c "$n.other-gpu-denied")" '^OTHER .*Operation not permitted' "$(printf '%s\n' "$o" | grep '^OTHER')"
    fi
    # loaded, and from the driver's file: the SONAME path the spec binds it to, or the versioned
    # file; an image's stale link must not redirect the mount (libcuda.so.470.57.02 is wrong)
    for p in libcuda.so.1 libnvidia-ml.so.1 libcuda.so; do
        i=${p%%.so*}
        assert_match "$(c "$n.dlopen-$p")" "^DLOPEN $p OK /.*/$i\.so\.(1|${DV//./\\.})\$" "$(printf '%s\n' "$o" | grep "^DLOPEN $p ")"
    done
    assert_match "$(c "$n.cuinit-returns")" '^CALL cuInit RETURNED -?[0-9]+$' "$(printf '%s\n' "$o" | grep '^CALL cuInit' | head -1)"
    assert_match "$(c "$n.nvmlinit-returns")" '^CALL nvmlInit_v2 RETURNED -?[0-9]+$' "$(printf '%s\n' "$o" | grep '^CALL nvmlInit_v2')"
    for p in libcuda.so.1 libnvidia-ml.so.1; do
        assert_match "$(c "$n.ldconfig-lists-$p")" "^LDCACHE[[:space:]]+$p " "$(printf '%s\n' "$o" | grep '^LDCACHE' | tr '\t' ' ')"
    done
    assert_eq "$(c "$n.params-modify-device-files-0")" "PARAMS ModifyDeviceFiles: 0" "$(printf '%s\n' "$o" | grep '^PARAMS')"
}

# run_probe <engine> <image> <device> <gpu indexes>
run_probe() {
    local e=$1 img=$2 dev=$3 gpus=$4 own="" other=7 o rc t
    for i in $gpus; do own=/dev/nvidia$i; break; done
    t=$(now_ms)
    case $e in
        podman-runc) o=$(M -m "$EM" podman --runtime runc run --rm --cap-add MKNOD --device "nvidia.com/gpu=$dev" \
                         -e OWN="$own" -e OTHER="$other" "localhost/e2e-$img:1" /bin/sh -c "$PROBE" 2>&1); rc=$?;;
        podman-crun) o=$(M -m "$EM" podman --runtime crun run --rm --cgroups=disabled --cap-add MKNOD --device "nvidia.com/gpu=$dev" \
                         -e OWN="$own" -e OTHER="$other" "localhost/e2e-$img:1" /bin/sh -c "$PROBE" 2>&1); rc=$?;;
        cri) o=$(M -m "$EM" python3 /root/e2e-engines/cri/cri-run.py "docker.io/library/e2e-$img:1" \
                 --cdi "nvidia.com/gpu=$dev" -- /bin/sh -c "OWN=$own OTHER=$other; $PROBE" 2>&1); rc=$?;;
    esac
    info "$e $img gpu=$dev: exit $rc in $(( $(now_ms) - t )) ms; $(printf '%s\n' "$o" | grep -E '^(DLOPEN|CALL) ' | tr '\n' ';' | sed 's/;$//')"
    check_run "$e" "$img" "$dev" "$gpus" "$rc" "$o"
}

ALL=""; for ((i = 0; i < NGPU; i++)); do ALL+="$i "; done
LAST=$((NGPU - 1))
for e in podman-runc podman-crun cri; do
    for img in debian lib64 stale; do run_probe "$e" "$img" 0 0; done
    run_probe "$e" debian "$(gpu_uuid "$LAST")" "$LAST"
    run_probe "$e" debian all "$ALL"
done

# ---- NVIDIA's own tools accept what we built ---------------------------------------------------
out=$(M -m "$EM" /root/e2e-engines/nvidia-ctk cdi list 2>&1)
miss=""
for d in $(seq 0 "$LAST") all; do grep -qx "nvidia.com/gpu=$d" <<<"$out" || miss+="$d "; done
for ((i = 0; i < NGPU; i++)); do grep -qx "nvidia.com/gpu=$(gpu_uuid "$i")" <<<"$out" || miss+="$(gpu_uuid "$i") "; done
if [ -z "$miss" ]; then pass "$(c nvidia-ctk-cdi-list)"; else fail "$(c nvidia-ctk-cdi-list)" "missing $miss in: $out"; fi
assert_no_match "$(c nvidia-ctk-cdi-list-no-errors)" '(level=error|level=warning|failed)' "$out"
# /dev/char: nvidia-ctk's links into a scratch dir, compared with the machine's (name -> node)
out=$(M -m "$EM" sh -c 'rm -rf /tmp/ctkchar && /root/e2e-engines/nvidia-ctk system create-dev-char-symlinks --dev-char-path /tmp/ctkchar >/dev/null 2>&1; for l in /tmp/ctkchar/*; do [ -L "$l" ] && echo "${l##*/} $(readlink -f "$l")"; done | sort')
ours=$(M -m "$EM" sh -c 'for l in /dev/char/*; do [ -L "$l" ] || continue; t=$(readlink -f "$l"); case "$t" in /dev/nvidia*) echo "${l##*/} $t";; esac; done | sort')
info "/dev/char: nvidia-ctk made $(printf '%s' "$out" | grep -c .) links to NVIDIA nodes, the machine has $(printf '%s' "$ours" | grep -c .)"
if [ -n "$out" ] && [ "$out" = "$ours" ]; then pass "$(c dev-char-equals-nvidia-ctk)"
else fail "$(c dev-char-equals-nvidia-ctk)" "nvidia-ctk: [$out] ours: [$ours]"; fi

# leave the rig as baseline expects it: stub driver again, kube1 restarted by the next baseline
# (its binds were taken from the stub files that the version switch replaced)
trap - EXIT
stop_unit "$EM" >/dev/null 2>&1
fake_driver_version "$DRIVER_VERSION"
stop_unit kube1 >/dev/null 2>&1
if [ -n "$REALV" ]; then
    # every file the real driver put into the host is gone again (or a stub's, by its marker)
    # shellcheck disable=SC2016
    left=$(H sh -c 'cd "/opt/e2e-fake-driver/$1" || exit 1
        for f in $(cd lib && find . ! -type d | sed "s|^\./||"); do
            p=/usr/lib/x86_64-linux-gnu/$f
            if [ -e "$p" ] && ! grep -q e2e_fake_driver "$p"; then echo "$p"; fi
        done
        for f in $(ls bin); do
            if [ -e "/usr/bin/$f" ] && ! grep -q e2e_fake_driver "/usr/bin/$f"; then echo "/usr/bin/$f"; fi
        done' sh "$REALV" 2>&1)
    assert_eq "$(c rig-back-on-stubs)" "" "$left"
fi
scenario_end
