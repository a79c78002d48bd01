#!/usr/bin/env bash
# The test suite: sets up the venv, then runs pytest. Extra arguments go to pytest.
# PostgreSQL tests read AIRFLOW_TRIALS_TEST_POSTGRES_URL and are skipped, with the reason, when it is unset.
#
# With AIRFLOW_TRIALS_FAULT_TESTS=1 and no test paths among the arguments (the whole suite, as CI
# runs it), the fault suite (tests/faults: whole stacks, mostly waiting on them) runs in a second
# pytest process beside the other tests (below), then tests/system/test_demo.py runs alone: its
# demo finds "the" Ray of the machine by scanning for Ray processes, which must see no other
# cluster. Every fault stack and test Ray has its own ports and temp dir, and PostgreSQL tests
# their own schema or database.
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

# Whole Airflow stacks must not run more than two at a time on 2 cores (three at once time out),
# so tests/faults runs in a second pytest process beside the other tests, one stack at a time.
#
# The other tests run in AIRFLOW_TRIALS_TEST_WORKERS pytest-xdist workers (default 2), a module
# to a worker at a time; the fault modules in moved_faults go to the workers first, as one unit, so
# that their stacks, too, start one at a time (tests/conftest.py pytest_collection_modifyitems,
# tests/work_units.py), and the fault process and the workers end about together. Most of the
# other tests wait on Ray and Airflow rather than compute, so two workers finish them and the moved
# modules in the time one process took for the other tests alone (docs/benchmarks.md, "sixth
# session"). With AIRFLOW_TRIALS_TEST_WORKERS=1 they run in one process instead, then
# test_checkpoints_kept.py. Servers take their ports from airflow_trials.ports (below the
# ephemeral range, reserved machine-wide), so busy processes never take each other's ports.
workers="${AIRFLOW_TRIALS_TEST_WORKERS:-2}"
# The main job's own test starts a whole stack of its own, so it runs with the moved fault modules;
# only tests/system/test_demo.py, which must see no other Ray, runs alone at the end.
main_job_test=tests/system/test_main_job.py
if [ "$workers" -ge 2 ] 2>/dev/null; then
    # The modules with stacks of their own, and the Ray head restart on a shared stack of the
    # workers' own: a third of the fault suite.
    moved_faults=(tests/faults/test_checkpoints_kept.py tests/faults/test_main_job_interrupted.py
        tests/faults/test_trials_db_drops.py tests/faults/test_bad_input.py
        tests/faults/test_ray_head_restart.py)
else
    moved_faults=(tests/faults/test_checkpoints_kept.py)
fi
fault_ignores=()
first_ignores=()
for module in tests/faults/test_*.py; do
    case " ${moved_faults[*]} " in
        *" $module "*) fault_ignores+=("--ignore=$module") ;;
        *) first_ignores+=("--ignore=$module") ;;
    esac
done
faults_log="$(mktemp -t airflow_trials_faults.XXXXXX.log)"
echo "[test.sh] tests/faults runs in a second pytest process beside the others; its output follows theirs." >&2
run_pytest tests/faults "${fault_ignores[@]}" "$@" >"$faults_log" 2>&1 &
faults_pid=$!
trap 'kill -- "$faults_pid" 2>/dev/null; pkill -P "$faults_pid" 2>/dev/null' INT TERM
if [ "$workers" -ge 2 ] 2>/dev/null; then
    run_pytest -n "$workers" --dist loadscope --no-loadscope-reorder tests "$main_job_test" \
        --ignore=tests/system "${first_ignores[@]}" "$@"
    rest_rc=$?
else
    run_pytest tests --ignore=tests/faults --ignore=tests/system "$@"
    rest_rc=$?
    run_pytest "${moved_faults[@]}" "$main_job_test" "$@"
    moved_rc=$?
    [ "$rest_rc" -eq 0 ] && rest_rc=$moved_rc
fi
wait "$faults_pid"
faults_rc=$?
trap - INT TERM
echo "==================== tests/faults (second process) ===================="
cat "$faults_log"
rm -f "$faults_log"
run_pytest tests/system --ignore="$main_job_test" "$@"
system_rc=$?
echo "[test.sh] exit codes: other tests $rest_rc, tests/faults $faults_rc, tests/system $system_rc" >&2
[ "$rest_rc" -eq 0 ] && [ "$faults_rc" -eq 0 ] && [ "$system_rc" -eq 0 ]
