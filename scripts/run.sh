#!/usr/bin/env bash
# The main job: real Airflow (scheduler, dag-processor, triggerer, api-server) and a local Ray head on
# embedded defaults in ./.state, running the example experiment with its trials in parallel on Ray.
# Extra arguments go to `airflow-trials run` (e.g. --keep-running, --num-cpus 2).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh"
cd "$repo"
exec airflow-trials run "$@"
