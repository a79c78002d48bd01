#!/usr/bin/env bash
# Creates .venv and installs the package with the pinned versions; sourced by run.sh and test.sh.
# Re-installs only when pyproject.toml or constraints.txt changed since the last install.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${AIRFLOW_TRIALS_VENV:-$repo/.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "[bootstrap] creating virtual environment in $venv" >&2
    "$python" -m venv "$venv"
fi
stamp="$venv/.airflow_trials_install_stamp"
want="$(cat "$repo/pyproject.toml" "$repo/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[bootstrap] installing pinned dependencies (constraints.txt)" >&2
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # uv (pinned in constraints.txt) installs the same pins as pip, in parallel: under a minute
    # instead of about three; it compiles the bytecode as pip does, so that the first processes
    # of a run do not each compile the same modules. Where uv cannot run, pip does the same install.
    if ! { "$venv/bin/python" -m pip install --quiet -c "$repo/constraints.txt" uv \
        && "$venv/bin/python" -m uv pip install --quiet --compile-bytecode --python "$venv/bin/python" \
            -c "$repo/constraints.txt" -e "$repo[dev]"; }; then
        echo "[bootstrap] uv could not install: installing with pip" >&2
        "$venv/bin/python" -m pip install --quiet -c "$repo/constraints.txt" -e "$repo[dev]"
    fi
    echo "$want" > "$stamp"
fi
# The package's own modules (installed editable) and the tests' (which Ray workers and test
# subprocesses import) are compiled by neither installer. Where PYTHONDONTWRITEBYTECODE is set, as
# on this project's CI machines, every process would compile them again (a DAG file's parse: 0.25
# to 0.27 s from source, 0.16 to 0.25 s compiled). Files already compiled are skipped.
"$venv/bin/python" -m compileall -q "$repo/src" "$repo/tests" > /dev/null || true
export PATH="$venv/bin:$PATH"
export VIRTUAL_ENV="$venv"
# Ray's token auth is meant for shared clusters; the local head the scripts start is private.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
