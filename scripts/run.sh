#!/usr/bin/env bash
# The main job: runs a real tuning experiment through the trial engine on a local Ray and prints its leaderboard.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh"
cd "$repo"
exec python -m airflow_trials.demo "$@"
