# shellcheck shell=bash
# Loaded (after lib/common.sh) into every scenario. A scenario is a file scenarios/NN-name.sh that
# is sourced by `harness.sh _scenario` in its own bash process, with errexit OFF: an assertion
# that fails records FAIL and the scenario goes on; a scenario that dies or times out is recorded
# by the harness. State changes a scenario makes (GPU count, libraries, flags) are undone by the
# next scenario's `baseline`.

SC_NAME=$(basename "${1:-${BASH_SOURCE[-1]}}" .sh)

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
# journal of the unit under test since a cursor-ish point in time (usec since epoch)
unit_journal_since() { # <m> <since: "@epoch">
    H journalctl --no-pager -o cat -u "$(unit_of "$1")" --since "$2" 2>/dev/null
}

# baseline: the state every scenario may assume: E2E_GPUS fake GPUs, driver libraries present,
# default driver version, no failure flags, kube1 running with containerd and kubelet active.
baseline() {
    local m
    H /usr/local/lib/e2e/fakehw version "$DRIVER_VERSION" >/dev/null
    fake_gpus "$E2E_GPUS"; restore_libs
    for m in kube1 kube2; do
        mflag_clear "$m" fail-containerd; mflag_clear "$m" slow-stop
    done
    if ! unit_active kube1 || ! machine_registered kube1; then
        start_unit kube1 >/dev/null 2>&1
    fi
    if ! wait_machine_up kube1 120; then
        fail "$(c baseline)" "kube1 is not up: $(uprop ActiveState kube1)/$(uprop SubState kube1)"
        return 1
    fi
}
