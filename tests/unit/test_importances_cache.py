"""The importances cache (searchers/importances_cache.py): an answer computed once per set of
inputs is read back equal, other inputs compute again, an unreadable file is recomputed, an
unwritable directory only warns, and the oldest files beyond the cap are deleted."""

from __future__ import annotations

import logging

import pytest

from airflow_trials.core.importances import prepare_importances
from airflow_trials.searchers import importances_cache
from airflow_trials.searchers.importances_cache import ImportancesCache, cache_key
from airflow_trials.searchers.optuna_importances import evaluate_importances
from tests.unit.test_importances import SPACE, SUBJECT, synthetic_run


class CountingEvaluator:
    """The real evaluator, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, data, evaluator):
        self.calls += 1
        return evaluate_importances(data, evaluator)


def run_data(seed: int = 0, num_trials: int = 20):
    configs, values = synthetic_run(num_trials, seed=seed)
    return prepare_importances(
        configs, values, metric="loss", mode="min", subject=SUBJECT, search_space=SPACE
    )


@pytest.mark.parametrize("evaluator", ["ped-anova", "fanova"])
def test_the_second_call_reads_what_the_first_computed(tmp_path, evaluator):
    cache, compute = ImportancesCache(tmp_path), CountingEvaluator()
    first = cache.get_or_compute(run_data(), evaluator, compute)
    again = cache.get_or_compute(run_data(), evaluator, compute)
    assert compute.calls == 1
    assert again == first and again.params[0].name == "lr"
    assert isinstance(again.params[0].spec.choices, tuple)
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_other_values_another_evaluator_or_another_metric_compute_again(tmp_path):
    cache, compute = ImportancesCache(tmp_path), CountingEvaluator()
    cache.get_or_compute(run_data(), "ped-anova", compute)
    cache.get_or_compute(run_data(num_trials=21), "ped-anova", compute)  # a trial more
    cache.get_or_compute(run_data(), "fanova", compute)
    configs, values = synthetic_run(20)
    as_max = prepare_importances(configs, values, metric="loss", mode="max", subject=SUBJECT)
    cache.get_or_compute(as_max, "ped-anova", compute)
    assert compute.calls == 4


def test_the_key_changes_with_one_trials_value():
    configs, values = synthetic_run(20)
    changed = [values[0] + 1e-9, *values[1:]]
    keys = {
        cache_key(prepare_importances(configs, v, metric="loss", mode="min", subject=SUBJECT), e)
        for v in (values, changed)
        for e in ("ped-anova", "fanova")
    }
    assert len(keys) == 4


def test_an_unreadable_file_is_computed_again_and_rewritten(tmp_path):
    cache, compute = ImportancesCache(tmp_path), CountingEvaluator()
    first = cache.get_or_compute(run_data(), "ped-anova", compute)
    (path,) = tmp_path.glob("*.json")
    path.write_text('{"params": [', encoding="utf-8")
    assert cache.get_or_compute(run_data(), "ped-anova", compute) == first
    assert compute.calls == 2
    assert cache.get_or_compute(run_data(), "ped-anova", compute) == first
    assert compute.calls == 2


def test_an_unwritable_directory_warns_and_still_answers(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    cache, compute = ImportancesCache(blocker / "importances"), CountingEvaluator()
    with caplog.at_level(logging.WARNING, logger=importances_cache.__name__):
        found = cache.get_or_compute(run_data(), "ped-anova", compute)
    assert found.params[0].name == "lr"
    assert "Could not cache the importances in" in caplog.text and "XDG_CACHE_HOME" in caplog.text


def test_the_oldest_files_beyond_the_cap_are_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(importances_cache, "MAX_FILES", 2)
    cache, compute = ImportancesCache(tmp_path), CountingEvaluator()
    for seed in range(3):
        cache.get_or_compute(run_data(seed), "ped-anova", compute)
    assert len(list(tmp_path.glob("*.json"))) == 2
    cache.get_or_compute(run_data(0), "ped-anova", compute)  # the oldest went: computed again
    assert compute.calls == 4


def test_the_default_directory_is_under_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert ImportancesCache().directory == tmp_path / "airflow_trials" / "importances"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ImportancesCache().directory == tmp_path / "home" / ".cache" / "airflow_trials" / (
        "importances"
    )
