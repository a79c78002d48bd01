#!/usr/bin/env bash
# The test suite: sets up the venv, then runs pytest. Extra arguments go to pytest.
# PostgreSQL tests read AIRFLOW_TRIALS_TEST_POSTGRES_URL and are skipped, with the reason, when it is unset.
#
# With AIRFLOW_TRIALS_FAULT_TESTS=1 and no test paths among the arguments (the whole suite, as CI
# runs it), every test but tests/system, the fault suite (tests/faults: whole stacks, mostly
# waiting on them) included, runs in pytest-xdist worker processes (AIRFLOW_TRIALS_TEST_WORKERS,
# default 3), then tests/system runs alone: its demo finds "the" Ray of the machine by scanning
# for Ray processes, which must see no other cluster. Every fault stack and test Ray has its own
# ports and temp dir, and PostgreSQL tests their own schema or database.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh" || exit 1
# bootstrap.sh sets errexit; this script collects each pytest run's exit code itself, so that a
# failure in the other tests still runs tests/system.
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

# The whole suite but tests/system runs in WORKERS pytest-xdist worker processes, a module (or
# the fault cases on the shared stack) to a worker at a time, the longest first (tests/conftest.py
# pytest_collection_modifyitems): the fault cases mostly wait on their stacks, and the other tests
# on Ray and Airflow processes, so more processes than cores keep both cores busy.
workers="${AIRFLOW_TRIALS_TEST_WORKERS:-3}"
run_pytest -n "$workers" --dist loadscope --no-loadscope-reorder tests --ignore=tests/system "$@"
rest_rc=$?
run_pytest tests/system "$@"
system_rc=$?
echo "[test.sh] exit codes: tests (faults included) $rest_rc, tests/system $system_rc" >&2
[ "$rest_rc" -eq 0 ] && [ "$system_rc" -eq 0 ]
