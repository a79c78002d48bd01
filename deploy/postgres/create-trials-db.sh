#!/usr/bin/env bash
# Creates the trials metadata database and its owner next to Airflow's own database.
#
# The postgres image runs this once, when its data volume is first initialised (it is mounted in
# /docker-entrypoint-initdb.d). Airflow's database is POSTGRES_DB; the trials database is a
# separate one, named TRIALS_DB_NAME and owned by TRIALS_DB_USER, so the trials schema and its
# migrations never touch Airflow's tables. Its schema is created by the init job
# (airflow-trials db upgrade), not here.
set -euo pipefail

: "${TRIALS_DB_NAME:?set TRIALS_DB_NAME, the trials database to create}"
: "${TRIALS_DB_USER:?set TRIALS_DB_USER, the owner of the trials database}"
: "${TRIALS_DB_PASSWORD:?set TRIALS_DB_PASSWORD, the password of TRIALS_DB_USER}"

# psql substitutes :"name" (an identifier) and :'name' (a literal) safely in SQL read from stdin.
psql --no-psqlrc -v ON_ERROR_STOP=1 \
    --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-postgres}" \
    -v trials_db="$TRIALS_DB_NAME" -v trials_user="$TRIALS_DB_USER" \
    -v trials_password="$TRIALS_DB_PASSWORD" <<'SQL'
CREATE ROLE :"trials_user" WITH LOGIN PASSWORD :'trials_password';
CREATE DATABASE :"trials_db" OWNER :"trials_user";
SQL
