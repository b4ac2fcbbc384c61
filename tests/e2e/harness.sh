#!/bin/bash
# tests/e2e/harness.sh -- end-to-end harness for nspawn-lifecycle-helper under a real systemd.
#
#   outer machine (CI VM or dev box, root; PID 1 may or may not be systemd)
#   └─ systemd-nspawn --boot "e2ehost"      the "host": systemd 252 as PID 1, dbus, machined,
#      │   rootfs = overlay(cached debootstrap, tmpfs upper): pristine on every `up`
#      │   fake NVIDIA driver + GPUs (lib/fakehw.sh), the helper at its stable path (read-only bind)
#      └─ systemd-nspawn@kube1.service       the STOCK unit + the drop-in that `install` writes
#           /var/lib/machines/kube1 = overlay(same cache, tmpfs upper); real containerd,
#           kubelet.service stand-in (sleep infinity); kube2 likewise for the two-machine scenario
#
# Usage: harness.sh [deps|build|up|down|shell|scenarios|run] [NN ...]   (default: run, every scenario;
#        scenario numbers or names after run/scenarios select, as E2E_SCENARIOS does)
#   run = deps build up scenarios down + teardown check; always tears down (trap), also on error.
# Output: `PASS <name>` / `FAIL <name>: <detail>` / `SKIP <name>: <why>` per assertion, then
#   `N passed, N failed, N skipped`. Exit status is non-zero iff something failed.
# Knobs: see tests/e2e/README.md (HELPER, E2E_REQUIRE_HELPER, E2E_DIR, E2E_SCENARIOS, E2E_GPUS, ...)
set -euo pipefail

E2E_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E2E_DIR=${E2E_DIR:-/var/tmp/nspawn-lifecycle-e2e}
CACHE=$E2E_DIR/cache
ROOTFS=$CACHE/rootfs                  # debootstrap (with containerd), overlay lower for host and machines
RUN=$E2E_DIR/run                      # tmpfs: overlay uppers, support files, pid files
LOGS=$E2E_DIR/logs                    # kept after `down`: debootstrap log, host console, results
RESULTS=${RESULTS:-$LOGS/results.txt}
MACHINE=${MACHINE:-kube1}
MACHINES=${E2E_MACHINES:-kube1 kube2}
HOSTNAME_=e2ehost
CG_NAME=nspawn-lifecycle-e2e          # cgroup (in each writable hierarchy) holding the outer nspawn
# shellcheck source=../lib/debian-mirror.sh
. "$E2E_SRC/../lib/debian-mirror.sh"
MIRROR=${E2E_MIRROR:-$(debian_mirror)}
SUITE=bookworm
# One image for host and machines: containerd is only needed in the machines, but a second
# debootstrap costs ~33 s while adding containerd to the one costs ~3 s (README: measurements).
PKGS=systemd,systemd-sysv,dbus,systemd-container,containerd
E2E_GPUS=${E2E_GPUS:-2}
DRIVER_VERSION=${E2E_DRIVER_VERSION:-580.82.07}
DRIVER_VERSIONS="$DRIVER_VERSION ${E2E_EXTRA_DRIVER_VERSIONS:-580.95.05}"   # stubs built for each
SCENARIO_TIMEOUT=${E2E_SCENARIO_TIMEOUT:-600}
export E2E_DIR RUN LOGS RESULTS MACHINE HELPER E2E_REQUIRE_HELPER E2E_GPUS DRIVER_VERSION \
    HELPER_FAILPOINTS E2E_REQUIRE_FAILPOINTS

# shellcheck source=lib/common.sh
. "$E2E_SRC/lib/common.sh"
# shellcheck source=lib/mkoci.sh
. "$E2E_SRC/lib/mkoci.sh"

[ "$(id -u)" = 0 ] || die "must run as root"
mkdir -p "$LOGS"

# ---------------------------------------------------------------------------------------------
deps() {
    local need=() c
    for c in systemd-nspawn:systemd-container nsenter:util-linux gcc:gcc python3:python3-minimal \
             findmnt:util-linux timeout:coreutils; do
        command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
    done
    if [ ! -e "$ROOTFS/.e2e-complete" ] || [ "${REBUILD:-0}" = 1 ]; then
        command -v debootstrap >/dev/null || need+=(debootstrap)
        # debootstrap of Debian needs its keyring (absent on e.g. Ubuntu runners)
        [ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
    fi
    if [ ${#need[@]} -gt 0 ]; then
        log "apt-get install ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >"$LOGS/apt.log" 2>&1 \
            || { tail -20 "$LOGS/apt.log"; die "apt-get install failed"; }
    fi
    grep -qw overlay /proc/filesystems || modprobe overlay || die "overlayfs not available"
}

# ---------------------------------------------------------------------------------------------
build() {
    if [ -e "$ROOTFS/.e2e-complete" ] && [ "${REBUILD:-0}" != 1 ]; then log "rootfs cached: $ROOTFS"; return; fi
    rm -rf "$ROOTFS.tmp" "$ROOTFS"
    mkdir -p "$CACHE"
    local t0; t0=$(date +%s)
    [ -n "$MIRROR" ] || die "no Debian mirror: none in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list; set E2E_MIRROR"
    log "debootstrap --variant=minbase --include=$PKGS $SUITE (log: $LOGS/debootstrap.log)"
    debootstrap --variant=minbase --include=$PKGS $SUITE "$ROOTFS.tmp" "$MIRROR" >"$LOGS/debootstrap.log" 2>&1 \
        || { tail -20 "$LOGS/debootstrap.log"; die "debootstrap failed"; }
    : > "$ROOTFS.tmp/etc/machine-id"             # every overlay gets its own
    rm -rf "$ROOTFS.tmp/var/cache/apt/archives/"*.deb "$ROOTFS.tmp/var/lib/apt/lists/"*
    touch "$ROOTFS.tmp/.e2e-complete"
    mv "$ROOTFS.tmp" "$ROOTFS"
    log "rootfs built in $(( $(date +%s) - t0 )) s ($(du -sh "$ROOTFS" | cut -f1))"
}

# ---------------------------------------------------------------------------------------------
overlay() { # overlay <name> <mountpoint>
    local up=$RUN/ovl/$1
    mountpoint -q "$2" && return 0
    mkdir -p "$up/upper" "$up/work" "$2"
    mount -t overlay "e2e-$1" -o "lowerdir=$ROOTFS,upperdir=$up/upper,workdir=$up/work" "$2"
}

# Stand-in driver files, built on the outer machine (the host image has no compiler).
build_driver_stubs() {
    local v lib soname d i
    for v in $DRIVER_VERSIONS; do
        d=$RUN/support/driver/$v
        mkdir -p "$d/lib/vdpau" "$d/bin" "$d/firmware"
        # <file stem>:<SONAME>; glcore's SONAME is its full versioned name, like the real one
        for lib in libcuda:libcuda.so.1 libnvidia-ml:libnvidia-ml.so.1 \
                   libnvidia-ptxjitcompiler:libnvidia-ptxjitcompiler.so.1 libEGL_nvidia:libEGL_nvidia.so.0 \
                   libGLX_nvidia:libGLX_nvidia.so.0 libnvidia-cfg:libnvidia-cfg.so.1 \
                   "libnvidia-glcore:libnvidia-glcore.so.$v" vdpau/libvdpau_nvidia:libvdpau_nvidia.so.1; do
            soname=${lib#*:}; lib=${lib%%:*}
            gcc -shared -fPIC -O0 -DE2E_LIB="\"${lib##*/}\"" -DE2E_VERSION="\"$v\"" -Wl,-soname,"$soname" \
                -o "$d/lib/$lib.so.$v" "$E2E_SRC/lib/stub.c"
        done
        # E2E_EXTRA_LIBS=N more stand-in libraries (libnvidia-e2e-extraNNN.so.<v>, SONAME .so.1), so
        # a driver install has 8+N library files, like a real one (~200); used by tests/bench
        for ((i = 1; i <= ${E2E_EXTRA_LIBS:-0}; i++)); do
            lib=$(printf 'libnvidia-e2e-extra%03d' "$i")
            gcc -shared -fPIC -O0 -DE2E_LIB="\"$lib\"" -DE2E_VERSION="\"$v\"" -Wl,-soname,"$lib.so.1" \
                -o "$d/lib/$lib.so.$v" "$E2E_SRC/lib/stub.c"
        done
        for b in nvidia-smi nvidia-debugdump nvidia-persistenced nvidia-cuda-mps-control nvidia-cuda-mps-server; do
            printf '#!/bin/sh\n# e2e_fake_driver: stand-in for %s %s\necho "%s %s (e2e stand-in)"\n' "$b" "$v" "$b" "$v" > "$d/bin/$b"
            chmod 755 "$d/bin/$b"
        done
        printf 'e2e_fake_driver GSP firmware %s\n' "$v" > "$d/firmware/gsp_ga10x.bin"
        printf 'e2e_fake_driver GSP firmware %s\n' "$v" > "$d/firmware/gsp_tu10x.bin"
    done
}

# A real NVIDIA driver's userspace in the fake host, beside the stubs (issue 11): Debian's
# nvidia-graphics-drivers laid out as NVIDIA's .run installer does by tests/realdriver/fetch.sh
# (cached .debs; E2E_REAL_DRIVER=0: none), or any tree in that layout given as
# E2E_REAL_DRIVER_ROOT (usr/lib/x86_64-linux-gnu/*.so.*, usr/bin/nvidia-*,
# lib/firmware/nvidia/<ver>/). Staged once on disk as one more driver version, marked .real, and
# bind-mounted read-only into the host at /opt/e2e-fake-driver/<ver>; `fakehw version <ver>`
# (scenario 16) makes the fake host use it.
REAL_STAGE=""; REAL_VERSION=""
stage_real_driver() {
    local r=${E2E_REAL_DRIVER_ROOT:-} v d fetch=$E2E_SRC/../realdriver/fetch.sh
    if [ -z "$r" ]; then
        [ "${E2E_REAL_DRIVER:-1}" != 0 ] && [ -x "$fetch" ] || return 0
        r=$CACHE/realdriver-run
        v=$("$fetch" version)
        if [ "$(cat "$r/.e2e-complete" 2>/dev/null)" != "$v" ]; then
            rm -rf "$r"
            "$fetch" install run "$r" >"$LOGS/realdriver.log" 2>&1 || { tail -20 "$LOGS/realdriver.log"; die "tests/realdriver/fetch.sh install run failed"; }
            echo "$v" > "$r/.e2e-complete"
        fi
    fi
    [ -d "$r/usr/lib/x86_64-linux-gnu" ] || die "real driver root $r has no usr/lib/x86_64-linux-gnu"
    v=$(find "$r/usr/lib/x86_64-linux-gnu" -maxdepth 1 -type f -name 'libcuda.so.*.*' -printf '%f\n' | sed 's/^libcuda\.so\.//' | head -1)
    [ -n "$v" ] || die "real driver root $r has no libcuda.so.<version> in usr/lib/x86_64-linux-gnu"
    d=$CACHE/realdriver-stage/$v
    if [ "$(cat "$d/.real" 2>/dev/null)" != "$r" ] || [ -n "${E2E_REAL_DRIVER_ROOT:-}" ]; then
        rm -rf "$d"; mkdir -p "$d/lib" "$d/bin" "$d/firmware"
        cp -a "$r/usr/lib/x86_64-linux-gnu/." "$d/lib/"
        [ ! -d "$r/usr/bin" ] || find "$r/usr/bin" -maxdepth 1 -type f -name 'nvidia-*' -exec cp -a {} "$d/bin/" \;
        [ ! -d "$r/lib/firmware/nvidia/$v" ] || cp -a "$r/lib/firmware/nvidia/$v/." "$d/firmware/"
        echo "$r" > "$d/.real"
    fi
    REAL_STAGE=$d; REAL_VERSION=$v
    log "real driver $v (from $r): $(find "$d/lib" -type f | wc -l) library files, bound at /opt/e2e-fake-driver/$v"
}

write_support() {
    mkdir -p "$RUN/support/images"
    install -m755 "$E2E_SRC/lib/standin-helper.sh" "$RUN/support/standin-helper"
    build_driver_stubs
    mkoci "$RUN/support/images/e2e-hello.tar" docker.io/library/e2e-hello:1 "hello from the e2e image"
    mkcorrupt "$RUN/support/images/e2e-corrupt.tar"
}

prepare_host() {
    local h=$RUN/host
    overlay host "$h"
    systemd-id128 new > "$h/etc/machine-id"
    echo "$HOSTNAME_" > "$h/etc/hostname"
    # containerd is in the shared image for the machines' sake; the host must not run it
    ln -sfn /dev/null "$h/etc/systemd/system/containerd.service"
    # a real host has modules; the rendered .nspawn may BindReadOnly=/lib/modules
    mkdir -p "$h/lib/modules/$(uname -r)"
    # fake NVIDIA driver: stub files, the script that lays them out, and a boot unit that does it
    # before any systemd-nspawn@.service can start (they are ordered after sysinit.target)
    mkdir -p "$h/opt/e2e-fake-driver" "$h/usr/local/lib/e2e" "$h/etc/e2e"
    cp -a "$RUN/support/driver/." "$h/opt/e2e-fake-driver/"
    install -m755 "$E2E_SRC/lib/fakehw.sh" "$h/usr/local/lib/e2e/fakehw"
    # the product's drop-in for the shell doubles, which cannot print it (write_fallback_dropin)
    install -m644 "$E2E_SRC/../golden/dropin-kube1.conf" "$h$E2E_DROPIN_TEMPLATE"
    printf 'GPUS=%s\nKVER=%s\nUVER=%s\nLIBS=present\nUVM_MAJOR=%s\n' \
        "$E2E_GPUS" "$DRIVER_VERSION" "$DRIVER_VERSION" "$(uvm_major)" > "$h/etc/e2e/fakehw.env"
    cat > "$h/etc/systemd/system/e2e-fakehw.service" <<'EOF'
[Unit]
Description=e2e: fake NVIDIA driver and GPUs (device nodes, /proc/driver, /proc/devices, PCI, libraries)
DefaultDependencies=no
After=local-fs.target systemd-tmpfiles-setup-dev.service
Before=sysinit.target machines.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/lib/e2e/fakehw setup
[Install]
WantedBy=sysinit.target
EOF
    mkdir -p "$h/etc/systemd/system/sysinit.target.wants"
    ln -sfn ../e2e-fakehw.service "$h/etc/systemd/system/sysinit.target.wants/e2e-fakehw.service"
}

# A dynamic major for nvidia-uvm that the real kernel does not use (509 unless taken).
uvm_major() {
    local m
    for m in ${E2E_UVM_MAJOR:-509 508 507 506 505 504}; do
        awk '/^Character devices:/{c=1;next} /^$/{c=0} c{print $1}' /proc/devices | grep -qx "$m" || { echo "$m"; return; }
    done
    die "no free character major for the fake nvidia-uvm"
}

prepare_machine() { # prepare_machine <name>
    local m=$1 r=$RUN/machines/$1
    overlay "m-$m" "$r"
    # Device nodes in the image's /dev are useless (nspawn mounts its own /dev) and harmful: if the
    # tree ever gets chowned (-U), copying them up needs mknod, which DevicePolicy=closed refuses.
    find "$r/dev" -mindepth 1 -maxdepth 1 \( -type c -o -type b \) -delete
    systemd-id128 new > "$r/etc/machine-id"
    echo "$m" > "$r/etc/hostname"
    mkdir -p "$r/etc/e2e" "$r/var/lib/nspawn-lifecycle/images"
    # kubelet stand-in; /etc/e2e/slow-stop (seconds) makes stopping it slow (concurrency scenario)
    cat > "$r/etc/systemd/system/kubelet.service" <<'EOF'
[Unit]
Description=kubelet stand-in (e2e)
[Service]
ExecStart=/bin/sleep infinity
ExecStop=/bin/sh -c 'if [ -s /etc/e2e/slow-stop ]; then sleep "$(cat /etc/e2e/slow-stop)"; fi'
[Install]
WantedBy=multi-user.target
EOF
    ln -sfn ../kubelet.service "$r/etc/systemd/system/multi-user.target.wants/kubelet.service"
    # containerd (real, Debian's, enabled by its postinst): /etc/e2e/fail-containerd makes it fail.
    # Its state stays on the overlay rootfs: importing (unpacking) an image works there; running
    # containers would not (overlayfs snapshots cannot use an overlayfs upper) and is not needed.
    mkdir -p "$r/etc/systemd/system/containerd.service.d"
    cat > "$r/etc/systemd/system/containerd.service.d/e2e.conf" <<'EOF'
[Service]
ExecStartPre=/bin/sh -c 'if [ -e /etc/e2e/fail-containerd ]; then echo "e2e: containerd made to fail (/etc/e2e/fail-containerd exists)"; exit 1; fi'
EOF
    [ -e "$r/etc/systemd/system/multi-user.target.wants/containerd.service" ] \
        || ln -sfn /lib/systemd/system/containerd.service "$r/etc/systemd/system/multi-user.target.wants/containerd.service"
}

prepare_images() {
    mountpoint -q "$RUN" || { mkdir -p "$RUN"; mount -t tmpfs -o "size=${E2E_TMPFS_SIZE:-4G},mode=755" e2e-run "$RUN"; }
    write_support
    prepare_host
    local m
    for m in $MACHINES; do prepare_machine "$m"; done
}

# ---------------------------------------------------------------------------------------------
systemd_pid1() { [ "$(cat /proc/1/comm)" = systemd ] && [ -d /run/systemd/system ]; }
child_named() { # child_named <pid> <comm>
    local c
    for c in $(cat "/proc/$1/task/$1/children" 2>/dev/null); do
        [ "$(cat "/proc/$c/comm" 2>/dev/null)" = "$2" ] && { echo "$c"; return; }
    done
    true
}
cg_dirs() {
    if [ -d /sys/fs/cgroup/unified ]; then echo "/sys/fs/cgroup/unified/$CG_NAME"; fi
    if [ -d /sys/fs/cgroup/systemd ]; then echo "/sys/fs/cgroup/systemd/$CG_NAME"; fi
    if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then echo "/sys/fs/cgroup/$CG_NAME"; fi
}
helper_path() { # what gets bind-mounted at the stable path
    if [ -n "${HELPER:-}" ]; then
        [ -x "$HELPER" ] || die "HELPER=$HELPER is not an executable file"
        readlink -f "$HELPER"
    else
        echo "$RUN/support/standin-helper"
    fi
}

up() {
    helper_path >/dev/null     # validate HELPER here: a failure inside $(...) would not stop us
    local fp_bind=()
    stage_real_driver
    [ -z "$REAL_STAGE" ] || fp_bind+=(--bind-ro="$REAL_STAGE:/opt/e2e-fake-driver/$REAL_VERSION")
    if [ -n "${HELPER_FAILPOINTS:-}" ]; then
        [ -x "$HELPER_FAILPOINTS" ] || die "HELPER_FAILPOINTS=$HELPER_FAILPOINTS is not an executable file"
        fp_bind+=(--bind-ro="$(readlink -f "$HELPER_FAILPOINTS"):$HP_FAILPOINTS")
    fi
    if [ -n "$(host_leader)" ] && kill -0 "$(host_leader)" 2>/dev/null; then log "host already up"; return; fi
    down >/dev/null 2>&1 || true     # leftovers of a crashed run: every boot starts pristine
    local t0; t0=$(date +%s%N)
    prepare_images
    log "images prepared in $(( ($(date +%s%N) - t0) / 1000000 )) ms; booting host container"
    t0=$(date +%s%N)
    local launcher=()
    if systemd_pid1; then launcher=(systemd-run --quiet --scope --collect --unit="$CG_NAME" -p Delegate=yes); fi
    # SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 + --system-call-filter=bpf: the host's systemd gets a pure
    # cgroup2 tree and may load BPF device programs, i.e. DevicePolicy=/DeviceAllow= are enforced.
    # --capability=all, @keyring and perf_event_open: a real host hides no capability and no syscall from its
    # machines; without them the machine's Capability=all stopped at nspawn's 26 default
    # capabilities and runc could not create a container's session keyring (scenario 13).
    (
        if ! systemd_pid1; then
            for d in $(cg_dirs); do mkdir -p "$d"; echo $BASHPID > "$d/cgroup.procs"; done
        fi
        exec "${launcher[@]}" env SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 systemd-nspawn \
            --directory="$RUN/host" --boot --machine="$HOSTNAME_" \
            --register=no --keep-unit --private-network \
            --system-call-filter=bpf --system-call-filter=@keyring --system-call-filter=perf_event_open \
            --capability=all \
            --bind="$RUN/machines:/var/lib/machines" \
            --bind-ro="$(helper_path):$HP" "${fp_bind[@]}" \
            --console=read-only \
            ${E2E_HOST_NSPAWN_ARGS:-} ${E2E_HOST_INIT_ARGS:-}
    ) </dev/null >"$LOGS/host-console.log" 2>&1 &
    echo $! > "$RUN/host.nspawn"
    local n=$! l=
    for _ in $(seq 1 150); do l=$(child_named "$n" systemd); [ -n "$l" ] && break; sleep 0.1; done
    [ -n "$l" ] || { tail -30 "$LOGS/host-console.log"; die "host container did not start"; }
    echo "$l" > "$RUN/host.leader"
    for _ in $(seq 1 300); do [ -S "/proc/$l/root/run/systemd/private" ] && break; sleep 0.05; done
    local st; st=$(H timeout 120 systemctl is-system-running --wait 2>/dev/null || true)
    log "host container up: leader pid $l, state '$st' after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    if [ "$st" != running ]; then
        H systemctl --failed --no-pager >&2 || true
        die "host container is '$st', not running"
    fi
    install_machine "$MACHINE" up
}

# install_machine <m> [context]: what `install <m>` does, through the product when it exists;
# otherwise the harness writes the product's drop-in itself (write_fallback_dropin).
install_machine() {
    local m=$1 ctx=${2:-}
    if [ -n "${HELPER:-}" ]; then
        local out rc=0
        out=$(H "$HP" install "$m" 2>&1) || rc=$?
        if [ $rc = 0 ]; then
            [ -n "$ctx" ] && pass "$ctx.install-$m"
            log "install $m: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
            return 0
        fi
        fail "${ctx:-harness}.install-$m" "helper install exited $rc: $(printf '%s' "$out" | tail -5)"
        log "falling back to the harness-written drop-in for $m"
    fi
    write_fallback_dropin "$m"
}
# The drop-in is never a copy kept here (one drifted: RestartSec=2, no TimeoutStartSec=): the
# binary prints it (`install <m> --print-dropin`); the shell doubles (stand-in, reference helper)
# cannot, so for them it is the golden the test suite pins to the binary's bytes
# (tests/golden/dropin-kube1.conf, tests/install.rs), staged in the host by prepare_host.
write_fallback_dropin() {
    local m=$1 d text
    d=/etc/systemd/system/systemd-nspawn@$m.service.d
    if ! text=$(H "$HP" install "$m" --print-dropin 2>/dev/null) || [ -z "$text" ]; then
        text=$(H sed "s/kube1/$m/g" "$E2E_DROPIN_TEMPLATE") || die "no drop-in for $m"
    fi
    H mkdir -p "$d"
    printf '%s\n' "$text" | H tee "$d/50-nspawn-lifecycle.conf" >/dev/null
    H systemctl daemon-reload
}

shell() { H /bin/bash -l; }

# ---------------------------------------------------------------------------------------------
scenarios() {
    [ -n "$(host_leader)" ] || die "host container is not up (run: $0 up)"
    local f name rc
    for f in "$E2E_SRC"/scenarios/[0-9]*.sh; do
        name=$(basename "$f" .sh)
        if [ -n "${E2E_SCENARIOS:-}" ] && ! printf '%s\n' $E2E_SCENARIOS | grep -qx "${name%%-*}\|$name"; then continue; fi
        echo "==== scenario $name"
        _record BEGIN "$name"
        rc=0
        # not --foreground: timeout then signals the scenario's whole process group (nsenter,
        # systemctl, ...), and `wait` lets a SIGTERM/SIGINT to the harness interrupt at once
        timeout -k 10 "$SCENARIO_TIMEOUT" bash "$E2E_SRC/harness.sh" _scenario "$f" &
        SCENARIO_PID=$!
        wait "$SCENARIO_PID" || rc=$?
        SCENARIO_PID=
        scenario_verdict "$name" "$rc"
    done
}
# Every scenario parses (bash -n) before the rig boots: a syntax error half-way through a
# scenario would otherwise run its first half and stop.
syntax_check() {
    local f bad=0
    for f in "$E2E_SRC"/scenarios/[0-9]*.sh "$E2E_SRC"/lib/*.sh; do
        bash -n "$f" || { log "syntax error in $f"; bad=1; }
        case $f in */scenarios/*)
            [ "$(grep -v '^[[:space:]]*$' "$f" | tail -1)" = scenario_end ] || [ "${f##*/}" = 99-selftest-failure.sh ] \
                || { log "$f does not end with scenario_end"; bad=1; };;
        esac
    done
    [ "$bad" = 0 ] || die "scenarios do not parse or do not declare their end: fix them before the rig boots"
}
# Self-test of the wrapper, no rig needed: a scenario cut short by an unclosed `if`, one that
# exits early without a FAIL, and one that passed nothing must each fail; a whole one passes.
wrapper_selftest() {
    local d ok=0 name expect got rc
    local -x RESULTS
    d=$(mktemp -d)
    printf '%s\n' 'pass "$(c first)"' 'if true; then' '  pass "$(c never)"' > "$d/91-unclosed-if.sh"
    printf '%s\n' 'pass "$(c first)"' 'exit 0' 'pass "$(c never)"' 'scenario_end' > "$d/92-early-exit.sh"
    printf '%s\n' 'info nothing' 'scenario_end' > "$d/93-no-check.sh"
    printf '%s\n' 'pass "$(c one)"' 'pass "$(c two)"' 'scenario_end' > "$d/94-whole.sh"
    for name in 91-unclosed-if 92-early-exit 93-no-check 94-whole; do
        RESULTS=$d/results.txt; : > "$RESULTS"
        _record BEGIN "$name"
        rc=0; HELPER= bash "$E2E_SRC/harness.sh" _scenario_bare "$d/$name.sh" >/dev/null 2>&1 || rc=$?
        scenario_verdict "$name" "$rc" >/dev/null
        got=$(grep -c "^FAIL $name\." "$RESULTS") || true
        case $name in 94-*) expect=0;; *) expect=1;; esac
        if [ "$got" = "$expect" ]; then echo "wrapper self-test $name: $( [ "$expect" = 1 ] && echo reported || echo passed), as it must"
        else echo "wrapper self-test $name: $got failure(s), expected $expect"; ok=1; fi
    done
    rm -rf "$d"
    return $ok
}
_scenario_bare() { # internal (wrapper_selftest): a scenario with the results library only
    set +e +u
    set -o pipefail
    SC_NAME=$(basename "$1" .sh)
    # shellcheck disable=SC2317
    c() { echo "s${SC_NAME%%-*}.$1"; }
    scenario_end() { _record END "$SC_NAME $(scenario_checks "$SC_NAME")"; }
    # shellcheck disable=SC1090
    . "$1"
    exit 0
}
_scenario() { # internal: run one scenario file with the scenario library loaded
    set +e +u
    set -o pipefail
    # shellcheck source=lib/scenario.sh
    . "$E2E_SRC/lib/scenario.sh"
    # shellcheck disable=SC1090
    . "$1"
    # issue 16: every machine the scenario leaves running is checked with `status` (a scenario
    # that ends elsewhere says so with status_expect); a scenario that left early (skipped) is not
    status_epilogue
    exit 0     # a scenario's verdict is its assertions, not the status of its last command
}

# ---------------------------------------------------------------------------------------------
down() {
    local n; n=$(cat "$RUN/host.nspawn" 2>/dev/null || true)
    if [ -n "$n" ] && kill -0 "$n" 2>/dev/null; then
        log "halting host container (nspawn pid $n)"
        kill -TERM "$n"                      # nspawn turns SIGTERM into an orderly halt of the host
        for _ in $(seq 1 300); do kill -0 "$n" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$n" 2>/dev/null; then log "still running after 30 s, SIGKILL"; kill -KILL "$n"; sleep 1; fi
    fi
    rm -f "$RUN/host.nspawn" "$RUN/host.leader" 2>/dev/null || true
    local d
    if ! systemd_pid1; then
        for d in $(cg_dirs); do
            if [ -d "$d" ]; then find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
            if [ -d "$d" ]; then log "WARNING: could not remove cgroup $d"; fi
        done
    fi
    # unmount everything under $RUN, deepest first, then $RUN itself
    local mnts
    mnts=$(awk -v r="$RUN" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo | sort -r)
    for d in $mnts; do umount "$d" 2>/dev/null || umount -l "$d" 2>/dev/null || log "WARNING: cannot unmount $d"; done
    # nspawn leaves empty dirs behind when /run is not a tmpfs (as on a VM without systemd)
    rmdir "/run/systemd/nspawn/propagate/$HOSTNAME_" 2>/dev/null || true
    if ! systemd_pid1; then
        rmdir /run/systemd/nspawn/propagate /run/systemd/nspawn/locks /run/systemd/nspawn 2>/dev/null || true
    fi
    log "down"
}

# Teardown must leave nothing behind; checked from the outer machine after `down`.
check_clean() {
    local left p d
    left=$(awk -v r="$E2E_DIR" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo)
    if [ -z "$left" ]; then pass "teardown.no-mounts"; else fail "teardown.no-mounts" "$left"; fi
    left=""
    for p in /proc/[0-9]*; do
        d=$(readlink "$p/root" 2>/dev/null) || continue
        case "$d" in "$E2E_DIR"/*) left+="${p#/proc/}:$(cat "$p/comm" 2>/dev/null) ";; esac
        case "$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)" in
            *"--machine=$HOSTNAME_"*) left+="${p#/proc/}:$(cat "$p/comm" 2>/dev/null) ";;
        esac
    done
    if [ -z "$left" ]; then pass "teardown.no-processes"; else fail "teardown.no-processes" "$left"; fi
    left=""
    if systemd_pid1; then
        systemctl is-active -q "$CG_NAME.scope" 2>/dev/null && left="$CG_NAME.scope"
    else
        for d in $(cg_dirs); do [ -d "$d" ] && left+="$d "; done
    fi
    if [ -z "$left" ]; then pass "teardown.no-cgroups"; else fail "teardown.no-cgroups" "$left"; fi
}

run() {
    local t0 rc=0; t0=$(date +%s)
    : > "$RESULTS"
    trap 'down; check_clean; summary || true; exit 1' EXIT
    trap 'fail harness.interrupted "signal received; tearing down"; [ -n "${SCENARIO_PID:-}" ] && kill -TERM "$SCENARIO_PID" 2>/dev/null; exit 130' INT TERM
    log "HELPER=${HELPER:-<unset: stand-in>} E2E_REQUIRE_HELPER=${E2E_REQUIRE_HELPER:-0}" \
        "HELPER_FAILPOINTS=${HELPER_FAILPOINTS:-<unset: scenario 8 skipped>} E2E_REQUIRE_FAILPOINTS=${E2E_REQUIRE_FAILPOINTS:-0}"
    syntax_check
    wrapper_selftest || die "the scenario wrapper passes a scenario cut short"
    deps; build; up
    scenarios
    trap - EXIT
    down
    check_clean
    log "total $(( $(date +%s) - t0 )) s"
    summary || rc=1
    return $rc
}

cmd=${1:-run}; shift || true
# `run 01 08` and `scenarios 01 08` select like E2E_SCENARIOS="01 08" (they used to be ignored,
# and ran everything)
if { [ "$cmd" = run ] || [ "$cmd" = scenarios ]; } && [ $# -gt 0 ]; then
    E2E_SCENARIOS="$*"; set --
fi
case "$cmd" in
    deps|build|up|down|shell|scenarios|run|check_clean|syntax_check|wrapper_selftest) "$cmd" "$@";;
    _scenario) _scenario "$@";;
    _scenario_bare) _scenario_bare "$@";;
    *) die "unknown command $cmd (deps|build|up|down|shell|scenarios|run)";;
esac
