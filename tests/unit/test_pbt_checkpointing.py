"""PopulationBasedTraining refuses, before any trial starts, a trainable it could not clone."""

from __future__ import annotations

import pytest

from airflow_trials.execution.driver.exploit import check_can_exploit


@pytest.mark.parametrize(
    "trainable",
    ["tests.trainables:counting", "tests.trainables:FakeTrainable", "tests.trainables:peaked"],
)
def test_trainables_that_save_and_restore_are_accepted(trainable):
    check_can_exploit(trainable)


def test_a_function_that_never_restores_its_checkpoint_is_refused_with_the_fix():
    with pytest.raises(
        ValueError,
        match=r"PopulationBasedTraining: trainable 'tests.trainables:quadratic' never "
        r"calls airflow_trials.get_checkpoint\(\)\. PBT continues a trial from "
        r"another trial's checkpoint.*start from airflow_trials.get_checkpoint\(\)",
    ):
        check_can_exploit("tests.trainables:quadratic")


def test_a_class_without_save_checkpoint_is_refused():
    with pytest.raises(
        ValueError,
        match=r"trainable 'tests.trainables:NoCheckpoints' has no save_checkpoint "
        r"and no load_checkpoint\(\)\. .*implement both",
    ):
        check_can_exploit("tests.trainables:NoCheckpoints")
