"""TrialStore's surface (issue 48): a class whose methods are declared, its writes only; every read
is its reader's (TrialReader), and the writers only tests used are gone from it."""

from __future__ import annotations

import inspect

from airflow_trials.store import TrialReader, TrialStore

#: Writers no production code calls: the tests seed through record_progress (tests/factories.py).
TEST_ONLY_WRITERS = {"add_results", "add_checkpoint", "update_trial", "ensure_metric_index"}


def _public(names) -> set[str]:
    return {name for name in names if not name.startswith("_")}


def test_the_store_declares_at_most_25_public_methods_each_with_its_signature():
    declared = _public(vars(TrialStore))
    assert "record_progress" in declared and "record_transition" in declared
    assert len(declared | {"reader"}) <= 25, sorted(declared)
    for name in declared - {"url", "reader"}:
        method = vars(TrialStore)[name]
        assert inspect.isfunction(method), name
        assert method.__doc__, name  # help(TrialStore) says what it does
        kinds = {p.kind for p in inspect.signature(method).parameters.values()}
        assert inspect.Parameter.VAR_POSITIONAL not in kinds, name  # a real signature


def test_an_open_store_hands_out_nothing_but_its_reader(tmp_path):
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    try:
        assert _public(vars(store)) == {"reader"}
        assert isinstance(store.reader, TrialReader)
        assert _public(dir(store)) == _public(vars(TrialStore)) | {"reader"}
    finally:
        store.dispose()


def test_reads_live_on_the_reader_only_and_test_only_writers_are_gone(tmp_path):
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    try:
        reads = _public(dir(store.reader)) - {"dispose", "url"}
        assert {"leaderboard", "get_trial", "list_trials", "get_results"} <= reads
        assert reads & _public(dir(store)) == set()
        assert TEST_ONLY_WRITERS & _public(dir(store)) == set()
    finally:
        store.dispose()
