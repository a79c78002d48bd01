#!/usr/bin/env bash
# The test suite: sets up the venv, then runs pytest. Extra arguments go to pytest.
# PostgreSQL tests read AIRFLOW_TRIALS_TEST_POSTGRES_URL and are skipped, with the reason, when it is unset.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh" || exit 1
cd "$repo"
python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit "$rc"
