# shellcheck shell=bash
# Loaded (after lib/common.sh) into every scenario. A scenario is a file scenarios/NN-name.sh that
# is sourced by `harness.sh _scenario` in its own bash process, with errexit OFF: an assertion
# that fails records FAIL and the scenario goes on; a scenario that dies or times out is recorded
# by the harness. State changes a scenario makes (GPU count, libraries, flags) are undone by the
# next scenario's `baseline`.

SC_NAME=$(basename "${1:-${BASH_SOURCE[-1]}}" .sh)

# scenario_end: the last line of every scenario: it reached its end (with the number of checks it
# ran); the harness fails a scenario that did not (lib/common.sh, scenario_verdict).
scenario_end() { _record END "$SC_NAME $(scenario_checks "$SC_NAME")"; }
# scenario_off <why>: a scenario that does not apply to this run says so and leaves.
scenario_off() { _record END "$SC_NAME off: $*"; info "$SC_NAME: $*"; exit 0; }

# scenario <title> [--needs-helper]: print a header; with --needs-helper and no real binary, record
# one SKIP for the whole scenario and leave.
scenario() {
    local title=$1 needs=${2:-}
    info "$SC_NAME: $title"
    if [ "$needs" = --needs-helper ] && ! have_real_helper; then
        skip "$SC_NAME" "needs the real binary (set HELPER=/path/to/nspawn-lifecycle-helper)"
        exit 0
    fi
}
# a check name prefixed with the scenario number, e.g. `c devices-visible` -> s01.devices-visible
c() { echo "s${SC_NAME%%-*}.$1"; }

# ---- fake hardware knobs (run inside the host container) -------------------------------------
fake_gpus()           { H /usr/local/lib/e2e/fakehw gpus "$1" >/dev/null; }
remove_libs()         { H /usr/local/lib/e2e/fakehw remove-libs >/dev/null; }
restore_libs()        { H /usr/local/lib/e2e/fakehw restore-libs >/dev/null; }
fake_driver_version() { H /usr/local/lib/e2e/fakehw version "$@" >/dev/null; }   # KVER [UVER]
fake_status()         { H /usr/local/lib/e2e/fakehw status; }
fake_renumber()       { H /usr/local/lib/e2e/fakehw renumber "$1" >/dev/null; }   # 0|1

# ---- machine flags (files on the machine's rootfs, read by units baked into the image) -------
mflag_set()   { mkdir -p "$(mroot "$1")/etc/e2e"; printf '%s\n' "${3:-1}" > "$(mroot "$1")/etc/e2e/$2"; }   # <m> <flag> [content]
mflag_clear() { rm -f "$(mroot "$1")/etc/e2e/$2"; }

# ---- the unit under test ---------------------------------------------------------------------
# start_unit <m>: reset a failed state and start; returns the start's exit status
start_unit() { H systemctl reset-failed "$(unit_of "$1")" 2>/dev/null; H timeout 180 systemctl start "$(unit_of "$1")"; }
stop_unit()  { H timeout 120 systemctl stop "$(unit_of "$1")"; }
# wait_machine_up <m> [timeout]: unit active, machine registered, containerd and kubelet active
wait_machine_up() {
    local m=$1 t=${2:-120}
    wait_until "$t" unit_active "$m" && wait_until 30 machine_registered "$m" \
        && wait_until 60 inner_active containerd.service "$m" && wait_until 60 inner_active kubelet.service "$m"
}
# exec_field <m> <ExecStartPre|ExecStartPost> <argv substring> <field>: a field (pid, status,
# start_time, ...) of the last run of that command, from `systemctl show` (empty if it never ran)
exec_field() {
    uprop "$2" "$1" | grep -F -- "$3" | sed -n "s/.* $4=\([^;}]*\).*/\1/p" | sed 's/[][]//g; s/ *$//' | head -1
}
exec_count() { # exec_count <m> <ExecStartPre|ExecStartPost> <argv substring>: how many such entries
    uprop "$2" "$1" | grep -cF -- "$3"
}
nrestarts_ge() { [ "$(uprop NRestarts "$1")" -ge "$2" ] 2>/dev/null; }   # <m> <n>
nspawn_file() { H cat "/etc/systemd/nspawn/$1.nspawn" 2>/dev/null; }
leader_of()   { H machinectl show "$1" -p Leader --value 2>/dev/null; }
# open_errno <m> <path>: what open(2) for reading says inside the machine ("opened" or strerror)
open_errno() {
    local out
    out=$(M -m "$1" /bin/sh -c "exec 3<'$2' && echo opened" 2>&1)
    case "$out" in
        *opened*) echo opened;;
        *"No such device or address"*) echo ENXIO;;
        *"Operation not permitted"*) echo EPERM;;
        *"No such file or directory"*) echo ENOENT;;
        *"No such device"*) echo ENODEV;;
        *) echo "other: $out";;
    esac
}
# mknod_open <m> <major> <minor>: root in the machine makes a node of that number and opens it:
# EPERM when the machine's device cgroup refuses it, ENXIO when it allows it (no driver behind)
mknod_open() {
    local out
    out=$(M -m "$1" /bin/sh -c "rm -f /dev/e2e-mknod; mknod /dev/e2e-mknod c $2 $3 2>&1 && exec 3</dev/e2e-mknod && echo opened; rm -f /dev/e2e-mknod" 2>&1)
    case "$out" in
        *opened*) echo opened;;
        *"No such device or address"*) echo ENXIO;;
        *"Operation not permitted"*) echo EPERM;;
        *) echo "other: $out";;
    esac
}
# journal of the unit under test since a point in time ("@epoch")
unit_journal_since() { # <m> <since>
    H journalctl --no-pager -o cat -u "$(unit_of "$1")" --since "$2" 2>/dev/null
}
# only what the helper itself logged (its stdout/stderr stream or syslog), not the machine's
# console, which the unit's journal also carries ("[FAILED] Failed to start containerd.service")
# The identifier systemd gives the hooks' stderr stream when it connects it (the binary's name):
# unlike the unit, journald does not have to read it from /proc of a writer that may be gone
# (a line written right before a SIGKILL, systemd#2913).
HOOK_IDENT=SYSLOG_IDENTIFIER=nspawn-lifecycle-helper
hook_journal_since() { # <m> <since> [journal match, default: the machine's unit]
    H journalctl --no-pager -o json --output-fields=MESSAGE,_CMDLINE,_EXE,SYSLOG_IDENTIFIER \
        "${3:--u$(unit_of "$1")}" --since "$2" 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: e = json.loads(line)
    except ValueError: continue
    who = " ".join(str(e.get(k, "")) for k in ("_CMDLINE", "_EXE", "SYSLOG_IDENTIFIER"))
    if "nspawn-lifecycle" not in who: continue
    m = e.get("MESSAGE", "")
    if isinstance(m, list): m = bytes(m).decode("utf-8", "replace")
    print(m)'
}
# the same, for the unit's current invocation only: a start that follows another within the
# journal's one-second --since granularity does not pick up the earlier start's lines
hook_journal_this_start() { # <m> <since>
    local id; id=$(H systemctl show -p InvocationID --value "$(unit_of "$1")")
    hook_journal_since "$1" "$2" "_SYSTEMD_INVOCATION_ID=$id"
}

# baseline: the state every scenario may assume: E2E_GPUS fake GPUs, driver libraries present,
# default driver version, no failure flags, kube1 running with containerd and kubelet active.
baseline() {
    local m
    H /usr/local/lib/e2e/fakehw version "$DRIVER_VERSION" >/dev/null
    fake_gpus "$E2E_GPUS"; restore_libs; fake_renumber 0
    for m in kube1 kube2; do
        mflag_clear "$m" fail-containerd; mflag_clear "$m" slow-stop
    done
    # an earlier scenario may have removed the drop-in (scenario 1 does, then relies on install):
    # put it back so one broken install does not cascade through every later scenario
    if [ "$(exec_count kube1 ExecStartPre 'nspawn-lifecycle pre-start')" != 1 ]; then
        info "baseline: our hooks are not in effect for kube1, installing again"
        install_machine kube1 baseline
        stop_unit kube1 >/dev/null 2>&1
    fi
    if ! unit_active kube1 || ! machine_registered kube1; then
        start_unit kube1 >/dev/null 2>&1
    fi
    if ! wait_machine_up kube1 120; then
        fail "$(c baseline)" "kube1 is not up: $(uprop ActiveState kube1)/$(uprop SubState kube1)"
        return 1
    fi
}

# ---- product artifacts inside the machine ----------------------------------------------------
CDI_SPEC=/var/run/cdi/nvidia.com-gpu.json
gpu_uuid() { printf 'GPU-e2e00000-0000-4000-8000-%012d' "$1"; }     # as lib/fakehw.sh makes them

# check_cdi_spec <m> <gpus>: the CDI spec the product wrote in machine <m>, checked against
# DESIGN §5.3 (structure, names, CDI 0.5.0 compatibility, our own hooks, no nvidia-cdi-hook) on the
# outer machine, then every device node, mount source and the hook binary it names is checked
# INSIDE the machine.
check_cdi_spec() {
    local m=$1 n=$2 f out line uuids="" i
    f=$(mktemp)
    if ! M -m "$m" cat "$CDI_SPEC" > "$f" 2>/dev/null; then
        fail "$(c cdi-spec-present)" "$CDI_SPEC missing in $m"; rm -f "$f"; return
    fi
    pass "$(c cdi-spec-present)"
    for ((i = 0; i < n; i++)); do uuids+="$(gpu_uuid "$i") "; done
    out=$(python3 - "$f" "$n" "$DRIVER_VERSION" $uuids <<'PY'
import json, sys
path, n, ver, uuids = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def ok(k): print("OK " + k)
def bad(k, d): print("BAD %s: %s" % (k, d))
try:
    spec = json.load(open(path))
except Exception as e:
    bad("cdi-json", e); sys.exit(0)
ok("cdi-json")
(ok if spec.get("cdiVersion") == "0.5.0" else lambda k: bad(k, spec.get("cdiVersion")))("cdi-version-0.5.0")
(ok if spec.get("kind") == "nvidia.com/gpu" else lambda k: bad(k, spec.get("kind")))("cdi-kind")
extra = set(spec) - {"cdiVersion", "kind", "devices", "containerEdits"}
(ok if not extra else lambda k: bad(k, sorted(extra)))("cdi-no-unknown-top-level-keys")
# fields that CDI 0.5.x parsers (podman 4.3) reject
forbidden = {"annotations", "additionalGids", "intelRdt", "netDevices"}
found = []
def walk(o, p=""):
    if isinstance(o, dict):
        for k, v in o.items():
            if k in forbidden: found.append(p + "/" + k)
            walk(v, p + "/" + k)
    elif isinstance(o, list):
        for i, v in enumerate(o): walk(v, "%s[%d]" % (p, i))
walk(spec)
(ok if not found else lambda k: bad(k, found))("cdi-no-fields-0.5-rejects")
devs = {d.get("name"): d for d in spec.get("devices", [])}
want = {str(i) for i in range(n)} | set(uuids) | {"all"}
(ok if set(devs) == want else lambda k: bad(k, "got %s want %s" % (sorted(devs), sorted(want))))("cdi-device-names")
def nodes(edits): return [x.get("path") for x in (edits or {}).get("deviceNodes", [])]
probs = []
for i in range(n):
    for name in (str(i), uuids[i] if i < len(uuids) else None):
        d = devs.get(name)
        if d is None: continue
        p = nodes(d.get("containerEdits"))
        for node in ("/dev/nvidia%d" % i, "/dev/dri/card%d" % (i + 1), "/dev/dri/renderD%d" % (128 + i)):
            if node not in p: probs.append("%s lacks %s" % (name, node))
        others = [x for x in p if x.startswith("/dev/nvidia") and x[11:].isdigit() and x != "/dev/nvidia%d" % i]
        if others: probs.append("%s also has %s" % (name, others))
allp = nodes(devs.get("all", {}).get("containerEdits"))
for i in range(n):
    if "/dev/nvidia%d" % i not in allp: probs.append("all lacks /dev/nvidia%d" % i)
(ok if not probs else lambda k: bad(k, "; ".join(probs)))("cdi-device-nodes-per-gpu")
ce = spec.get("containerEdits", {})
common = nodes(ce)
miss = [x for x in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") if x not in common]
(ok if not miss else lambda k: bad(k, "common deviceNodes lack %s (have %s)" % (miss, common)))("cdi-control-nodes")
env = ce.get("env", [])
(ok if "NVIDIA_VISIBLE_DEVICES=void" in env else lambda k: bad(k, env))("cdi-env-visible-devices-void")
mounts = ce.get("mounts", [])
cps = {m.get("containerPath", ""): m for m in mounts}
# Driver files are bound under a tmpfs (DRIVER_DIR); the standard paths and SONAME links are made
# by our create-symlinks hook, libraries listed in ld.so.cache by update-ldcache (src/model/cdi.rs).
DRIVER_DIR = "/run/nspawn-lifecycle-driver"
HOOK = "/run/nspawn-lifecycle/nspawn-lifecycle-helper"
tm = cps.get(DRIVER_DIR, {})
(ok if tm.get("type") == "tmpfs" else lambda k: bad(k, "no tmpfs at %s: %s" % (DRIVER_DIR, tm)))("cdi-driver-tmpfs")
need = ["libcuda.so.%s" % ver, "libnvidia-ml.so.%s" % ver]
miss = [x for x in need if not any(cp.startswith(DRIVER_DIR + "/") and cp.endswith("/" + x) for cp in cps)]
(ok if not miss else lambda k: bad(k, "no mount for %s" % miss))("cdi-mounts-libraries")
(ok if DRIVER_DIR + "/usr/bin/nvidia-smi" in cps else lambda k: bad(k, "no nvidia-smi mount"))("cdi-mounts-nvidia-smi")
atimage = [cp for cp in cps if cp != DRIVER_DIR and not cp.startswith(DRIVER_DIR + "/")]
(ok if not atimage else lambda k: bad(k, "binds at image paths: %s" % atimage[:5]))("cdi-no-bind-at-image-paths")
badopts = [m.get("containerPath") for m in mounts
           if "/lib" in m.get("containerPath", "") and not {"ro", "nosuid", "nodev", "rbind", "rprivate"} <= set(m.get("options", []))]
(ok if not badopts else lambda k: bad(k, "mounts without ro,nosuid,nodev,rbind,rprivate: %s" % badopts[:5]))("cdi-mount-options")
allhooks = [h for e in [ce] + [d.get("containerEdits", {}) for d in devs.values()] for h in e.get("hooks", [])]
nh = [h.get("path") for h in allhooks if "nvidia-cdi-hook" in (h.get("path") or "") or "nvidia-ctk" in (h.get("path") or "")]
(ok if not nh else lambda k: bad(k, nh))("cdi-no-nvidia-cdi-hook")
verbs = [(h.get("args") or [None, None, None])[2] for h in ce.get("hooks", [])
         if h.get("path") == HOOK and h.get("hookName") == "createContainer"]
want = ["create-symlinks", "update-ldcache", "disable-device-node-modification"]
(ok if verbs == want and len(allhooks) == 3 else lambda k: bad(k, "hooks %s" % allhooks))("cdi-hooks-ours")
# A hook without env gets the container's from runc: every hook of ours names a fixed one.
noenv = [h.get("args") for h in allhooks if not h.get("env")]
(ok if not noenv else lambda k: bad(k, "hooks without env: %s" % noenv))("cdi-hooks-fixed-env")
links = [a for h in ce.get("hooks", []) for a in (h.get("args") or []) if "::" in a]
wl = ["libcuda.so.%s::/usr/lib/x86_64-linux-gnu/libcuda.so.1" % ver, "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
      "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so.1", "libnvidia-ml.so.1::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]
miss = [x for x in wl if x not in links]
(ok if not miss else lambda k: bad(k, "hook arguments lack %s" % miss))("cdi-hook-links-and-ldcache")
print("HOOK " + HOOK)
seen = set()
for e in [ce] + [d.get("containerEdits", {}) for d in devs.values()]:
    for x in e.get("deviceNodes", []):
        p = x.get("hostPath") or x.get("path")
        if p not in seen: seen.add(p); print("NODE " + p)
    for x in e.get("mounts", []):
        p = x.get("hostPath")
        if x.get("type") == "tmpfs": continue
        if p and p not in seen: seen.add(p); print("MOUNT " + p)
PY
)
    while IFS= read -r line; do
        case "$line" in
            "OK "*)  pass "$(c "${line#OK }")";;
            "BAD "*) line=${line#BAD }; fail "$(c "${line%%:*}")" "${line#*: }";;
        esac
    done <<< "$out"
    # every node must be a real character device (not a symlink) and every mount source must exist,
    # as seen from inside the machine, where containerd/runc will resolve them
    local script="r=0" p
    while read -r kind p; do
        case "$kind" in
            NODE)  script+="; if [ -L '$p' ] || [ ! -c '$p' ]; then echo 'not a char device: $p'; r=1; fi";;
            MOUNT) script+="; [ -e '$p' ] || { echo 'missing mount source: $p'; r=1; }";;
            HOOK)  script+="; '$p' cdi-hook --help >/dev/null 2>&1 || { echo 'hook binary does not run: $p'; r=1; }";;
        esac
    done < <(printf '%s\n' "$out" | grep -E '^(NODE|MOUNT|HOOK) ')
    script+="; exit \$r"
    local res
    if res=$(M -m "$m" /bin/sh -c "$script" 2>&1); then pass "$(c cdi-paths-resolve-in-machine)"
    else fail "$(c cdi-paths-resolve-in-machine)" "$res"; fi
    rm -f "$f"
}

# snapshot <path...>: "path sha256 mtime" for each file (in the host container) to prove "writes nothing"
snapshot() { H sh -c 'for f in "$@"; do if [ -f "$f" ]; then echo "$f $(sha256sum < "$f" | cut -c1-16) $(stat -c %Y.%y "$f")"; else echo "$f absent"; fi; done' sh "$@"; }
# reconcile <m>: the product's reconcile, bounded; prints its output, returns its status
reconcile() { H timeout 180 "$HP" nspawn-lifecycle reconcile "$1"; }

# ---- `status` at the end of every scenario (issue 16) ----------------------------------------
# status_expect <m> <code>: the exit code `status <m>` must give when the scenario ends. Without
# it every machine the scenario leaves running must be in sync (0); a machine not running is
# only checked when the scenario names it here (`status` says 7 for it).
status_expect() { printf -v "STATUS_EXPECT_$1" '%s' "$2"; }
# status_epilogue: run by harness.sh after each scenario that ran to its end. Only the real
# binary has `status`; the shell test doubles (lib/*.sh) do not.
status_epilogue() {
    have_real_helper || return 0
    case "$HELPER" in *.sh) info "$SC_NAME: status epilogue not run for the test double $HELPER"; return 0;; esac
    local m want var out rc
    for m in kube1 kube2; do
        var=STATUS_EXPECT_$m; want=${!var:-}
        if [ -z "$want" ]; then
            unit_active "$m" && machine_registered "$m" || continue
            want=0
        fi
        out=$(H timeout 60 "$HP" status "$m" 2>&1); rc=$?
        info "$SC_NAME: status $m: exit $rc: $out"
        if [ "$rc" = "$want" ]; then pass "$(c "status-epilogue-$m")"
        else fail "$(c "status-epilogue-$m")" "expected exit $want, got $rc: $out"; fi
    done
}

# The post-start points only the gated order has (containerd stopped and released by post-start):
# a boot pre-start released containerd for (containerdAtBoot, the default) never reaches them.
# gated_order: the host's config says containerdAtBoot false; default_order: no config (the
# scenarios that use these start and end without one).
# shellcheck disable=SC2034  # used by the scenarios that source this file
GATED_ONLY_POINTS="post-start-after-containerd-stop post-start-mid-gate-release"
NL_CFG=/etc/nspawn-lifecycle/config.json
gated_order() { H sh -c "mkdir -p ${NL_CFG%/*} && echo '{\"defaults\": {\"containerdAtBoot\": false}}' > $NL_CFG"; }
default_order() { H rm -f "$NL_CFG"; }
