#!/usr/bin/env bash
# The test suite: sets up the venv, then runs pytest. Extra arguments go to pytest.
# PostgreSQL tests read AIRFLOW_TRIALS_TEST_POSTGRES_URL and are skipped, with the reason, when it is unset.
#
# With AIRFLOW_TRIALS_FAULT_TESTS=1 and no test paths among the arguments (the whole suite, as CI
# runs it), the fault suite (tests/faults: whole stacks, mostly waiting on them) runs in a second
# pytest process beside the other tests (two of its modules with their own stacks after them, in
# the first, so that both take about as long), then tests/system runs alone: its demo finds "the" Ray of
# the machine by scanning for Ray processes, which must see no other cluster. Every fault stack and
# test Ray has its own ports and temp dir, and PostgreSQL tests their own schema or database.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh" || exit 1
# bootstrap.sh sets errexit; this script collects each pytest run's exit code itself, so that a
# failure in the other tests still waits for the fault suite, prints its output and runs tests/system.
set +e
cd "$repo"

# pytest, with its "no tests collected" (exit code 5) made a failure.
run_pytest() {
    python -m pytest "$@"
    local rc=$?
    if [ "$rc" -eq 5 ]; then
        echo "pytest collected no tests: treating that as a failure" >&2
        return 1
    fi
    return "$rc"
}

paths_given=0
for arg in "$@"; do
    case "$arg" in
        -*) ;;
        *) [ -e "${arg%%::*}" ] && paths_given=1 ;;
    esac
done
if [ "${AIRFLOW_TRIALS_FAULT_TESTS:-}" != "1" ] || [ "$paths_given" -eq 1 ]; then
    run_pytest "$@"
    exit $?
fi

# One fault module that starts stacks of its own (about 5 minutes on 2 cores) runs after the other
# tests in the first process; the rest of tests/faults, the production shape's module included
# (a dozen processes, about 10 minutes), in the second. Both processes then take about as long
# (measured on 2026-11-27 from a fresh clone: 31.7 + 6.2 minutes in the first with
# test_trials_db_drops.py, about a minute, there too; 29.5 in the second, which now has it).
moved_faults=(tests/faults/test_checkpoints_kept.py)
faults_log="$(mktemp -t airflow_trials_faults.XXXXXX.log)"
echo "[test.sh] tests/faults runs in a second pytest process beside the others; its output follows theirs." >&2
run_pytest tests/faults "${moved_faults[@]/#/--ignore=}" "$@" >"$faults_log" 2>&1 &
faults_pid=$!
trap 'kill -- "$faults_pid" 2>/dev/null; pkill -P "$faults_pid" 2>/dev/null' INT TERM
run_pytest tests --ignore=tests/faults --ignore=tests/system "$@"
rest_rc=$?
run_pytest "${moved_faults[@]}" "$@"
moved_rc=$?
[ "$rest_rc" -eq 0 ] && rest_rc=$moved_rc
wait "$faults_pid"
faults_rc=$?
trap - INT TERM
echo "==================== tests/faults (second process) ===================="
cat "$faults_log"
rm -f "$faults_log"
run_pytest tests/system "$@"
system_rc=$?
echo "[test.sh] exit codes: other tests $rest_rc (the fault module after them $moved_rc), tests/faults $faults_rc, tests/system $system_rc" >&2
[ "$rest_rc" -eq 0 ] && [ "$faults_rc" -eq 0 ] && [ "$system_rc" -eq 0 ]
