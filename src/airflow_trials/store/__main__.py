"""``python -m airflow_trials.store upgrade [--url URL]``: create or upgrade the store's schema."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from airflow_trials.exceptions import StoreError
from airflow_trials.store.engine import create_store_engine, safe_url
from airflow_trials.store.migration import current_revision, migrate
from airflow_trials.trials_db_url import STORE_URL_ENV, trials_db_url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_trials.store",
        description="Manage the airflow_trials metadata store.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    upgrade = commands.add_parser("upgrade", help="apply every migration (safe to run again)")
    upgrade.add_argument(
        "--url",
        default=None,
        help=f"SQLAlchemy URL of the store; default: as the DAGs find it (the trials_default "
        f"connection, else ${STORE_URL_ENV}, else the default SQLite file)",
    )
    args = parser.parse_args(argv)
    source = "--url"
    if args.url:
        url = args.url
    else:
        url, source = trials_db_url()
    try:
        migrate(url)
    except StoreError as e:
        print(str(e), file=sys.stderr)
        return 1
    engine = create_store_engine(url)
    try:
        revision = current_revision(engine)
    finally:
        engine.dispose()
    print(
        f"Trial store at {safe_url(url)} (from {source}) is at the latest schema (revision "
        f"{revision})."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
