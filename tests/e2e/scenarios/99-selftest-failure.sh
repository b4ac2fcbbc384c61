# shellcheck shell=bash
# Self-test of the harness, only with E2E_SELFTEST_FAILURE=1: a scenario that fails and dies in
# the middle with the machine running, to prove that teardown still leaves no process, mount or
# cgroup behind (issue 5 §8) and that the run exits non-zero.
[ "${E2E_SELFTEST_FAILURE:-0}" = 1 ] || scenario_off "the harness self-test runs only with E2E_SELFTEST_FAILURE=1"
scenario "harness self-test: a scenario that fails and dies"
start_unit kube1 >/dev/null 2>&1
fail "$(c injected-failure)" "deliberate failure (E2E_SELFTEST_FAILURE=1)"
kill -KILL $$
