"""Contract of the schema check a reader makes before it opens a trials DB, on every backend: the
revision is read with SQLAlchemy alone (no Alembic import, so a CLI read does not pay it), it is
the one Alembic wrote, and the head this airflow_trials expects (``HEAD_REVISION``, known when it
is built) is Alembic's own head of the shipped revisions."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import text

from airflow_trials.exceptions import StoreError
from airflow_trials.store.engine import WRITE_OPTION
from airflow_trials.store.migration import (
    HEAD_REVISION,
    VERSION_TABLE,
    alembic_config,
    current_revision,
    head_revision,
    schema_revision,
)
from tests.contract.conftest import POSTGRESQL, SQLITE_FILE
from tests.contract.test_store_stop_reason import _migrate


def test_the_head_known_at_build_time_is_alembic_s_head():
    from alembic.script import ScriptDirectory

    assert HEAD_REVISION == head_revision()
    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == HEAD_REVISION


class SchemaRevisionContract:
    backend: str

    def test_a_db_never_migrated_has_no_revision(self, store_url):
        assert schema_revision(store_url) is None

    def test_a_migrated_db_is_at_the_head_and_an_older_one_at_its_revision(self, store):
        url = store._engine.url.render_as_string(hide_password=False)
        assert schema_revision(url) == HEAD_REVISION == current_revision(store._engine)
        _migrate(store._write_engine, "0019", upgrade=False)
        assert schema_revision(url) == "0019" != HEAD_REVISION
        _migrate(store._write_engine, "head", upgrade=True)
        assert schema_revision(url) == HEAD_REVISION

    def test_two_rows_in_the_version_table_are_an_error_naming_both(self, store):
        url = store._engine.url.render_as_string(hide_password=False)
        with store._engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
            connection.execute(text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('9999')"))
        with pytest.raises(StoreError, match=f"2 schema revisions \\({HEAD_REVISION}, 9999\\)"):
            schema_revision(url)

    def test_reading_the_revision_does_not_import_alembic(self, store):
        url = store._engine.url.render_as_string(hide_password=False)
        probe = (
            "import sys; from airflow_trials.store.migration import schema_revision; "
            f"print(schema_revision({url!r}), 'alembic' in sys.modules)"
        )
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [HEAD_REVISION, "False"]


class TestSQLiteFile(SchemaRevisionContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(SchemaRevisionContract):
    backend = POSTGRESQL
