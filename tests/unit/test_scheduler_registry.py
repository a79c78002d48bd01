"""The registry finds the schedulers' slices by itself: adding one is one module (plus its
conformance test), with no edit to schedulers/registry.py."""

from __future__ import annotations

import sys
import textwrap

import pytest

import airflow_trials.schedulers as schedulers
from airflow_trials import MOASHA, ASHAScheduler, HyperBandScheduler, MedianStoppingRule
from airflow_trials.schedulers import registry
from airflow_trials.schedulers.asha.asha_judging import RungJudge
from airflow_trials.schedulers.median.median_judging import MedianJudge
from airflow_trials.schedulers.moasha.moasha_judging import VectorRungJudge


def test_the_registry_finds_the_three_slices_that_judge_on_the_airflow_path():
    assert [s.name for s in registry.slices()] == ["ASHAScheduler", "MOASHA", "MedianStoppingRule"]
    for scheduler, metric, mode, judge in [
        (ASHAScheduler(max_t=9), "loss", "min", RungJudge),
        (MOASHA(max_t=9), ["a", "b"], ["min", "max"], VectorRungJudge),
        (MedianStoppingRule(), "loss", "min", MedianJudge),
    ]:
        settings = registry.judged_scheduler(scheduler, metric, mode).to_dict()
        assert registry.judged_from_dict(settings).to_dict() == settings
        assert type(registry.judge_for(settings, 0, 1, "t1")) is judge


def test_hyperband_is_no_slice_of_the_airflow_path():
    with pytest.raises(ValueError, match=r"ASHAScheduler\(\.\.\.\), MOASHA\(\.\.\.\) or Median"):
        registry.judged_scheduler(HyperBandScheduler(metric="loss", mode="min"))


_NEW_SLICE = """
    from dataclasses import asdict, dataclass

    from airflow_trials.core.scheduler import RULE_KEY
    from airflow_trials.schedulers.trial_judge import Judge, JudgedSlice


    class EveryOther:
        pass


    @dataclass(frozen=True)
    class EveryOtherRule:
        metric: str

        def to_dict(self):
            return {RULE_KEY: "every_other", **asdict(self)}


    class EveryOtherJudge(Judge):
        pass


    SLICE = JudgedSlice(
        name="EveryOther",
        scheduler=EveryOther,
        settings_type=EveryOtherRule,
        rule_key="every_other",
        settings=lambda scheduler, metric, mode: EveryOtherRule(metric),
        judge=lambda rule, bracket, run, trial: EveryOtherJudge(rule),
    )
"""


@pytest.fixture
def new_slice(tmp_path, monkeypatch):
    """A slice written as one new module under schedulers/ (here on a path of the package)."""
    (tmp_path / "every_other_judging.py").write_text(textwrap.dedent(_NEW_SLICE))
    monkeypatch.setattr(schedulers, "__path__", [*schedulers.__path__, str(tmp_path)])
    registry.slices.cache_clear()
    yield
    registry.slices.cache_clear()
    sys.modules.pop("airflow_trials.schedulers.every_other_judging", None)


def test_a_new_slice_is_one_module_the_registry_finds(new_slice):
    module = "airflow_trials.schedulers.every_other_judging"
    names = [s.name for s in registry.slices()]
    assert names == ["ASHAScheduler", "EveryOther", "MOASHA", "MedianStoppingRule"]
    scheduler = sys.modules[module].EveryOther()
    settings = registry.judged_scheduler(scheduler, "loss", "min")
    assert settings.to_dict() == {"rule": "every_other", "metric": "loss"}
    assert registry.judged_from_dict(settings.to_dict()) == settings
    judge = registry.judge_for(settings.to_dict(), 0, 1, "t1")
    assert type(judge).__name__ == "EveryOtherJudge" and judge.judging == settings
