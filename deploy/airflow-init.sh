#!/usr/bin/env bash
# The init job of docker-compose.yml: prepares both databases, the GPU pool, the checkpoint
# folder, and checks that Ray answers, before any Airflow component starts.
#
# Idempotent: every step may run again on an initialised stack. Reads:
#   AIRFLOW_CONN_TRIALS_DEFAULT, AIRFLOW_CONN_RAY_DEFAULT   the connections the tasks use
#   AIRFLOW_TRIALS_STORAGE       checkpoint folder to create (the ray connection's storage_path)
#   TRIALS_STORAGE_OWNER         uid:gid that gets that folder (when run as root); default none
#   TRIALS_GPU_POOL              GPU pool name; default gpu
#   TRIALS_GPU_POOL_GPUS         GPUs the pool stands for; default 1
#   TRIALS_SLOTS_PER_GPU         pool slots per GPU; default 4
#   TRIALS_INIT_CHECK_RAY        1 (default) to connect to Ray once and print its resources
#   TRIALS_INIT_RAY_ATTEMPTS     connection attempts before the job fails, 5 s apart; default 5
set -euo pipefail

log() { echo "[airflow-init] $*"; }

log "Migrating Airflow's metadata DB"
airflow db migrate

# The trials DB URL comes from the trials_default connection, the one tasks and triggers use, so
# the schema is created exactly where they will look for it.
trials_url="$(python -c 'from airflow_trials.hooks.trials import TrialsDbHook; print(TrialsDbHook().get_url())')"
log "Migrating the trials DB"
airflow-trials db upgrade --db-url "$trials_url"

log "Setting the GPU pool (include_deferred: deferred trial tasks keep their slots)"
airflow-trials pool set \
    --name "${TRIALS_GPU_POOL:-gpu}" \
    --gpus "${TRIALS_GPU_POOL_GPUS:-1}" \
    --slots-per-gpu "${TRIALS_SLOTS_PER_GPU:-4}"

storage="${AIRFLOW_TRIALS_STORAGE:?set AIRFLOW_TRIALS_STORAGE to the ray connection storage_path}"
case "$storage" in
    *://*)
        log "Preparing the checkpoint bucket of $storage"
        # The bucket of an object store URL (s3://bucket/prefix), created unless it exists.
        python - "$storage" <<'PY'
import sys

import fsspec

fs, path = fsspec.core.url_to_fs(sys.argv[1])
bucket = path.split("/", 1)[0]
if not fs.exists(bucket):
    fs.mkdir(bucket)
PY
        ;;
    *)
        log "Preparing the checkpoint folder $storage"
        mkdir -p "$storage"
        if [ -n "${TRIALS_STORAGE_OWNER:-}" ]; then
            # Ray actors write checkpoints, Airflow tasks delete old ones: both run as this owner.
            chown "$TRIALS_STORAGE_OWNER" "$storage"
            chmod 2775 "$storage"
        fi
        ;;
esac

if [ "${TRIALS_INIT_CHECK_RAY:-1}" = "1" ]; then
    log "Connecting to Ray as the ray_default connection says"
    # A head that just passed its healthcheck can still refuse a first client session (its Ray
    # Client server starts a server per client); try a few times before failing the init job.
    attempts="${TRIALS_INIT_RAY_ATTEMPTS:-5}"
    for attempt in $(seq 1 "$attempts"); do
        if python - <<'PY'
import ray

from airflow_trials.hooks.trials import RayHook

settings = RayHook().get_conn()
print(f"[airflow-init] Ray at {settings['address']}: {ray.cluster_resources()}")
ray.shutdown()
PY
        then
            break
        fi
        if [ "$attempt" -eq "$attempts" ]; then
            log "Could not connect to Ray after $attempts attempts: check the ray_default connection and the Ray head"
            exit 1
        fi
        log "Connecting to Ray failed (attempt $attempt of $attempts); trying again in 5 s"
        sleep 5
    done
fi
log "Done"
