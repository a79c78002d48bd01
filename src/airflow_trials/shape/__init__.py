"""The production shape: Celery workers, two triggerers, a three-node Ray cluster, PostgreSQL and
checkpoints in object storage. :mod:`.spec` describes it; :mod:`.local` runs it on one machine
(``airflow-trials shape up``); docker-compose.yml is checked against the same description."""
