"""tuning_experiment(approval=True): Airflow's ApprovalOperator between select_best and
publish_best, answered through Airflow's REST API (the answered runs are in
test_approval_answered.py).

The runs are real: ``dag.test()`` runs the DAG in this process (Ray trials, a SQLite trials DB)
and one real ``airflow api-server`` per module, on the same Airflow metadata DB, takes the
answer (``PATCH .../taskInstances/{task_id}/-1/hitlDetails``), as a person's click in the
Required Actions page does. ``dag.test()`` stands in for the scheduler: on Airflow 3.3 the
approval task waits in ``awaiting_input`` with no trigger, and dag.test() resumes it once the
api-server has written the answer, as the scheduler would.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import DAG

from airflow_trials.core.search import uniform
from airflow_trials.experiment import tuning_experiment
from airflow_trials.experiment.approval import approval_body

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
APPROVER = "bob"
TRIGGERER = "dag_test"  # the triggering_user_name of every DAG run dag.test() creates


def declare(**kwargs):
    with DAG("approved", schedule=None, start_date=START) as dag:
        tuning_experiment(
            experiment_name="approved",
            trainable="tests.trainables:counting",
            search_space={"x": uniform(0.0, 1.0)},
            metric="loss",
            group_id="tune",
            **kwargs,
        )
    return dag


def test_without_approval_select_best_publishes_and_with_it_publish_best_does_once_approved():
    plain = declare()
    assert "tune.approve_best" not in plain.task_dict
    assert [a.name for a in plain.get_task("tune.select_best").outlets] == ["approved_best_trial"]

    dag = declare(approval=True, approvers=["bob", {"id": "7", "name": "carol"}])
    approve = dag.get_task("tune.approve_best")
    publish = dag.get_task("tune.publish_best")
    assert isinstance(approve, ApprovalOperator)
    # Only the approvers may answer: Airflow's assigned_users.
    assert approve.assigned_users == [{"id": "bob", "name": "bob"}, {"id": "7", "name": "carol"}]
    assert approve.options == ["Approve", "Reject"] and list(approve.params) == ["reason"]
    assert approve.subject == "Publish the best trial of experiment approved?"
    assert approve.upstream_task_ids == {"tune.select_best"}
    assert publish.upstream_task_ids == {"tune.select_best", "tune.approve_best"}
    assert dag.get_task("tune.select_best").outlets == []
    assert [a.name for a in publish.outlets] == ["approved_best_trial"]


def test_an_approval_that_is_not_a_bool_is_refused_when_the_dag_file_is_parsed():
    with pytest.raises(
        ValueError,
        match=r"Experiment approved: approval='no' is not True or False; pass approval=True",
    ):
        declare(approval="no")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"approval": True}, "approval=True needs approvers, the Airflow user ids who may"),
        ({"approval": True, "approvers": []}, "approval=True needs approvers"),
        ({"approval": True, "approvers": "bob"}, "approvers='bob' is not a list of user ids"),
        ({"approval": True, "approvers": ["bob", ""]}, "approver '' is not a user id"),
        ({"approval": True, "approvers": [{"id": "7"}]}, "approver {'id': '7'} is not a user"),
        (
            {"approval": True, "approvers": ["bob"], "allow_self_approval": "yes"},
            "allow_self_approval='yes' is not True or False",
        ),
        ({"approvers": ["bob"]}, "approvers and allow_self_approval go with approval=True"),
        ({"allow_self_approval": True}, "approvers and allow_self_approval go with approval"),
    ],
)
def test_approval_without_approvers_or_with_bad_ones_is_refused_when_parsed(kwargs, message):
    with pytest.raises(ValueError, match=rf"^Experiment approved: {re.escape(message)}"):
        declare(**kwargs)


ONE_METRIC_BEST = {
    "experiment_name": "mnist",
    "experiment_run_id": 12,
    "trial_id": "mnist-ab12-3",
    "config": {"lr": 0.01, "layers": 2},
    "metric": "val_loss",
    "mode": "min",
    "value": 0.123456789,
    "iteration": 8,
    "best_checkpoint": "s3://ckpt/mnist-ab12-3/8",
    "finished_trials": 3,
    "failed_trials": 1,
    "never_ran_trials": 0,
    "trials": 4,
}


def test_the_body_shows_the_best_trial_its_metric_config_and_the_run_s_dashboard_page():
    body = approval_body(ONE_METRIC_BEST, "https://af.example/trials/runs/12")
    assert body.splitlines() == [
        "Experiment **mnist**, experiment run 12.",
        "",
        "- **Best trial:** `mnist-ab12-3`",
        "- **val_loss** (min): **0.123457** at iteration 8",
        '- **Config:** `{"layers": 2, "lr": 0.01}`',
        "- **Checkpoint:** `s3://ckpt/mnist-ab12-3/8`",
        "- **Trials:** 3 of 4 finished, 1 failed, 0 never ran",
        "",
        "[Open the run in the trials dashboard](https://af.example/trials/runs/12)",
        "",
        "Approve to publish this trial as the experiment's best (an event on its Asset); reject "
        "to publish nothing. Give a reason: it is recorded with your name.",
    ]


def test_with_several_metrics_the_body_shows_the_pareto_front_and_the_chosen_trial():
    best = {
        **ONE_METRIC_BEST,
        "trial_id": "t-fast",
        "metric": ["val_acc", "latency"],
        "mode": ["max", "min"],
        "values": {"val_acc": 0.8, "latency": 2.0},
        "pick": {"metric": "val_acc", "bounds": {"latency": [None, 5.0]}},
        "pareto_front": [
            {"trial_id": "t-accurate", "values": {"val_acc": 0.9, "latency": 10.0}},
            {"trial_id": "t-fast", "values": {"val_acc": 0.8, "latency": 2.0}},
        ],
        "constraints": ["memory <= 4"],
        "feasible": True,
        "best_checkpoint": None,
    }
    del best["value"]
    lines = approval_body(best, "/trials/runs/12").splitlines()
    assert lines[2:11] == [
        "- **Best trial:** `t-fast`, chosen from the Pareto front by the pick "
        '`{"metric": "val_acc", "bounds": {"latency": [null, 5.0]}}`',
        "- **Its metrics:** val_acc (max) 0.8, latency (min) 2",
        "",
        "**Pareto front** (2 trials):",
        "",
        "| trial | val_acc (max) | latency (min) |",
        "|---|---|---|",
        "| `t-accurate` | 0.9 | 10 |",
        "| `t-fast` (chosen) | 0.8 | 2 |",
    ]
    assert "- **Constraints:** met" in lines and "- **Checkpoint:** none kept" in lines
    assert "[Open the run in the trials dashboard](/trials/runs/12)" in lines
