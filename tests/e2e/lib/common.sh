# shellcheck shell=bash
# Shared by harness.sh and every scenario: logging, result recording, assertions and the
# helpers that reach into the host container (H) and into a machine (M).
#
# Results are appended to $RESULTS (on disk, outside the tmpfs) so that counts survive a scenario
# that dies, times out or is killed, and the teardown check that runs after `down`.

log()  { echo "[e2e $(date +%T)] $*" >&2; }
info() { echo "INFO $*"; }
die()  { log "ERROR: $*"; exit 1; }

# ---- results ---------------------------------------------------------------------------------
_record() { # _record PASS|FAIL|SKIP <line>
    mkdir -p "$(dirname "$RESULTS")"
    echo "$1 $2" >> "$RESULTS"
}
pass() { echo "PASS $1"; _record PASS "$1"; }
fail() { # fail <name> <detail...>
    local n=$1; shift
    local d="$*"
    d=${d//$'\n'/ | }
    echo "FAIL $n: ${d:0:600}"; _record FAIL "$n: ${d:0:600}"
}
# A skip is only legitimate while the real binary is not there yet. CI sets E2E_REQUIRE_HELPER=1,
# which turns every skip into a failure so that a green run cannot hide untested scenarios.
skip() { # skip <name> <reason...>
    local n=$1; shift
    if [ "${E2E_REQUIRE_HELPER:-0}" = 1 ]; then
        fail "$n" "would be skipped ($*), but E2E_REQUIRE_HELPER=1"
    else
        echo "SKIP $n: $*"; _record SKIP "$n: $*"
    fi
}
summary() { # prints the closing line; returns 1 when anything failed
    local p f s
    p=$(grep -c '^PASS ' "$RESULTS" 2>/dev/null) || true
    f=$(grep -c '^FAIL ' "$RESULTS" 2>/dev/null) || true
    s=$(grep -c '^SKIP ' "$RESULTS" 2>/dev/null) || true
    if [ "${s:-0}" -gt 0 ]; then
        echo
        echo "################################################################################"
        echo "## SKIPPED: $s check(s) did NOT run (HELPER is not set: no real binary to test)"
        grep '^SKIP ' "$RESULTS" | sed 's/^SKIP /##   /'
        echo "################################################################################"
    fi
    if [ "${f:-0}" -gt 0 ]; then
        echo
        echo "Failures:"
        grep '^FAIL ' "$RESULTS" | sed 's/^FAIL /  /'
    fi
    # A run that passed nothing proved nothing: "0 passed, 0 failed" is not a success.
    if [ "${p:-0}" = 0 ]; then
        echo "FAIL: no check passed"
        f=$(( ${f:-0} + 1 ))
    fi
    echo "${p:-0} passed, ${f:-0} failed, ${s:-0} skipped"
    [ "${f:-0}" = 0 ]
}

# ---- a scenario's end ------------------------------------------------------------------------
# The harness records `BEGIN <name>` before a scenario runs; the scenario's last line is
# `scenario_end`, which records `END <name> <checks it ran>`. A scenario that stopped before its
# end (an early exit, a syntax error half-way, an unclosed `if`) has no END and fails, unless it
# recorded why it stopped (a FAIL or SKIP of its own) or declared itself off (`scenario_off`).
scenario_checks() { # scenario_checks <name>: PASS/FAIL/SKIP lines since its BEGIN
    awk -v b="BEGIN $1" '$0 == b {c = 0; on = 1; next} on && /^(PASS|FAIL|SKIP) / {c++} END {print c + 0}' "$RESULTS"
}
scenario_since() { # scenario_since <name>: the results lines since its BEGIN
    awk -v b="BEGIN $1" '$0 == b {out = ""; on = 1; next} on {out = out $0 "\n"} END {printf "%s", out}' "$RESULTS"
}
scenario_verdict() { # scenario_verdict <name> <exit status>: judge how a scenario ended
    local name=$1 rc=$2 since end n
    case $rc in
        0) ;;
        124) fail "$name.completed" "timed out after ${SCENARIO_TIMEOUT}s (E2E_SCENARIO_TIMEOUT)";;
        *) fail "$name.completed" "scenario script died with status $rc";;
    esac
    since=$(scenario_since "$name")
    end=$(grep "^END $name " <<< "$since" | tail -1) || true
    if [ -n "$end" ]; then
        n=${end#"END $name "}
        case $n in
            off:*) info "scenario $name: ${n#off: }";;
            0) fail "$name.ran-checks" "reached its end having run no check";;
            *) info "scenario $name: reached its end, $n check(s)";;
        esac
    elif ! grep -Eq '^(FAIL|SKIP) ' <<< "$since"; then
        fail "$name.reached-end" "stopped before its last line (no scenario_end) without saying why"
    fi
}

# ---- assertions ------------------------------------------------------------------------------
assert_eq() { # assert_eq <name> <expected> <actual>
    if [ "$2" = "$3" ]; then pass "$1"; else fail "$1" "expected '$2', got '$3'"; fi
}
assert_ne() { # assert_ne <name> <unexpected> <actual>
    if [ "$2" != "$3" ]; then pass "$1"; else fail "$1" "did not expect '$3'"; fi
}
assert_match() { # assert_match <name> <extended regex> <text>
    # a here-string, not `printf | grep -q`: under pipefail grep -q leaving at the first match
    # made printf die of SIGPIPE now and then, a false "no match" (s01, 10 in 3000 tries here)
    if grep -Eq -- "$2" <<< "$3"; then pass "$1"; else fail "$1" "no match for /$2/ in: $3"; fi
}
assert_no_match() { # assert_no_match <name> <extended regex> <text>
    local hit
    if hit=$(printf '%s\n' "$3" | grep -E -- "$2"); then fail "$1" "unexpected match for /$2/: $hit"; else pass "$1"; fi
}
assert_cmd() { # assert_cmd <name> <cmd...>: PASS when the command exits 0
    local n=$1 out rc; shift
    out=$("$@" 2>&1); rc=$?
    if [ $rc = 0 ]; then pass "$n"; else fail "$n" "rc=$rc: $(printf '%s' "$out" | tail -5)"; fi
    return $rc
}
assert_not_cmd() { # assert_not_cmd <name> <cmd...>: PASS when the command exits non-zero
    local n=$1 out rc; shift
    out=$("$@" 2>&1); rc=$?
    if [ $rc != 0 ]; then pass "$n"; else fail "$n" "unexpectedly succeeded: $(printf '%s' "$out" | tail -3)"; fi
}
assert_le() { # assert_le <name> <a> <b>  (integers, a <= b)
    if [ -n "$2" ] && [ -n "$3" ] && [ "$2" -le "$3" ] 2>/dev/null; then pass "$1"; else fail "$1" "expected $2 <= $3"; fi
}
assert_lt() { # assert_lt <name> <a> <b>  (integers, a < b)
    if [ -n "$2" ] && [ -n "$3" ] && [ "$2" -lt "$3" ] 2>/dev/null; then pass "$1"; else fail "$1" "expected $2 < $3"; fi
}
wait_until() { # wait_until <timeout-seconds> <cmd...>: poll every 0.2 s
    local end=$(( $(date +%s) + $1 )); shift
    while :; do
        "$@" >/dev/null 2>&1 && return 0
        [ "$(date +%s)" -ge "$end" ] && return 1
        sleep 0.2
    done
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# ---- reaching into the rig -------------------------------------------------------------------
host_leader() { cat "$RUN/host.leader" 2>/dev/null; }
# H <cmd...>: run a command in the host container (all its namespaces). nsenter does NOT apply the
# container's seccomp filter or cgroup device policy (RIG-REPORT pitfall 9): never use H to probe
# device access, use `H systemd-run --wait --pipe ...` (a real unit) instead.
H() {
    local l; l=$(host_leader)
    [ -n "$l" ] || { echo "H: host container is not up" >&2; return 125; }
    nsenter -t "$l" -a "$@"
}
# M [-m MACHINE] <cmd...>: run a command inside a machine as a transient service of the machine's
# own systemd (its cgroup, seccomp and device policy apply). Exit status is the command's.
M() {
    local m=$MACHINE
    if [ "${1:-}" = -m ]; then m=$2; shift 2; fi
    H systemd-run -M "$m" --wait --pipe --quiet --collect -- "$@" </dev/null
}
# Mi: like M but passes standard input through (e.g. `printf x | Mi tee /etc/foo`).
Mi() {
    local m=$MACHINE
    if [ "${1:-}" = -m ]; then m=$2; shift 2; fi
    H systemd-run -M "$m" --wait --pipe --quiet --collect -- "$@"
}
# Machine root as seen from the outer machine (the overlay); only for files on the rootfs, not for
# the machine's own tmpfs mounts such as /run (use M cat for those).
mroot() { echo "$RUN/machines/${1:-$MACHINE}"; }

unit_of() { echo "systemd-nspawn@${1:-$MACHINE}.service"; }
uprop() { # uprop <prop> [machine]: a property of the machine's unit in the host systemd
    H systemctl show -p "$1" --value "$(unit_of "${2:-$MACHINE}")"
}
inner_state() { # inner_state <unit> [machine]: ActiveState of a unit inside the machine
    H systemctl -M "${2:-$MACHINE}" show -p ActiveState --value "$1" 2>/dev/null
}
inner_active() { [ "$(inner_state "$@")" = active ]; }
machine_registered() { H machinectl show "${1:-$MACHINE}" -p State --value 2>/dev/null | grep -qx running; }
unit_active() { [ "$(uprop ActiveState "${1:-$MACHINE}")" = active ]; }

# The helper as the product's CLI, run in the host container from its stable path.
HP=/usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper
# The failpoints build (HELPER_FAILPOINTS), bind-mounted here when given; scenario 8 mounts it
# over $HP for its duration so the hooks systemd runs are that build.
HP_FAILPOINTS=/usr/local/lib/e2e/nspawn-lifecycle-helper-failpoints
# The product's drop-in for kube1 (tests/golden/dropin-kube1.conf), staged in the host for the
# shell doubles, which cannot print it as the binary does (`install <m> --print-dropin`).
E2E_DROPIN_TEMPLATE=/usr/local/lib/e2e/dropin-kube1.conf
helper() { H "$HP" "$@"; }
have_real_helper() { [ -n "${HELPER:-}" ]; }
