"""The OpenLineage facets' pure functions (operators/lineage.py), and the package without the
optional ``apache-airflow-providers-openlineage``: it imports, builds DAGs, and emits nothing."""

from __future__ import annotations

import importlib
import sys

import pytest

from airflow_trials.operators import lineage
from airflow_trials.operators.lineage import (
    BEST_FACET,
    TRAINABLE_FACET,
    TRIALS_RUN_FACET,
    RunLineage,
    checkpoint_dataset,
    job_facet_fields,
    metrics_of,
    numbers_of,
    run_facet_fields,
    safe_db_url,
)


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        (
            "postgresql+psycopg://trials:secret@db:5432/trials?sslpassword=x",
            "postgresql+psycopg://trials@db:5432/trials",
        ),
        ("sqlite:////var/trials/trials.db", "sqlite:////var/trials/trials.db"),
    ],
)
def test_the_trials_db_url_loses_its_password_and_query(url, safe):
    assert safe_db_url(url) == safe


@pytest.mark.parametrize(
    ("uri", "dataset"),
    [
        ("/data/exp/t1/checkpoint_3", ("file", "/data/exp/t1/checkpoint_3")),
        ("file:///data/exp/t1/checkpoint_3", ("file", "/data/exp/t1/checkpoint_3")),
        ("file://nas/data/t1/checkpoint_3", ("file://nas", "/data/t1/checkpoint_3")),
        ("s3://bucket/exp/t1/checkpoint_3", ("s3://bucket", "exp/t1/checkpoint_3")),
        ("gs://bucket/exp/t1/checkpoint_3", ("gs://bucket", "exp/t1/checkpoint_3")),
        ("hdfs://nn:8020/exp/t1", ("hdfs://nn:8020", "/exp/t1")),
    ],
)
def test_a_checkpoint_is_named_as_openlineage_names_files(uri, dataset):
    assert checkpoint_dataset(uri) == dataset


def test_a_relative_checkpoint_path_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"'ckpt/1' is a relative path.*AIRFLOW_TRIALS_STORAGE"):
        checkpoint_dataset("ckpt/1")


def test_metrics_of_select_best_with_one_metric_and_with_several():
    one = {"metric": "loss", "mode": "min", "value": 0.1}
    assert metrics_of(one) == ({"loss": 0.1}, {"loss": "min"})
    several = {"metric": ["acc", "lat"], "mode": ["max", "min"], "values": {"acc": 0.9, "lat": 3}}
    assert metrics_of(several) == ({"acc": 0.9, "lat": 3}, {"acc": "max", "lat": "min"})


def test_a_trials_metrics_are_the_finite_numbers_of_its_last_result():
    result = {"loss": 0.5, "done": True, "note": "x", "nan": float("nan"), "training_iteration": 2}
    assert numbers_of(result) == {"loss": 0.5, "training_iteration": 2}
    assert numbers_of(None) == {}


RUN = RunLineage(
    experiment_name="mnist",
    trials_db="sqlite:////t.db",
    trainable="pkg.train:fit",
    run_key="manual__1",
    experiment_run_id=7,
    search_space={"lr": {"type": "loguniform"}},
    trial_id="t1",
    config={"lr": 0.01},
    metrics={"loss": 0.2},
    modes={"loss": "min"},
    checkpoint="s3://b/mnist/t1/checkpoint_2",
)


def test_the_facets_fields():
    assert job_facet_fields(RUN) == {
        TRIALS_RUN_FACET: {
            "experiment": "mnist",
            "runKey": "manual__1",
            "experimentRunId": 7,
            "trialsDb": "sqlite:////t.db",
        },
        TRAINABLE_FACET: {"trainable": "pkg.train:fit", "searchSpace": RUN.search_space},
    }
    assert run_facet_fields(RUN) == {
        BEST_FACET: {
            "trialId": "t1",
            "config": {"lr": 0.01},
            "metrics": {"loss": 0.2},
            "modes": {"loss": "min"},
            "checkpoint": "s3://b/mnist/t1/checkpoint_2",
        }
    }
    assert run_facet_fields(RunLineage("mnist", "sqlite:////t.db", "pkg.train:fit")) == {}


def test_operator_lineage_serializes_as_openlineage_events_carry_it():
    pytest.importorskip("airflow.providers.openlineage")
    from openlineage.client.serde import Serde

    built = lineage.operator_lineage(RUN)
    assert [(o.namespace, o.name) for o in built.outputs] == [("s3://b", "mnist/t1/checkpoint_2")]
    best = Serde.to_dict(built.run_facets[BEST_FACET])
    assert {k: v for k, v in best.items() if not k.startswith("_")} == run_facet_fields(RUN)[
        BEST_FACET
    ]
    assert best["_schemaURL"].endswith("#/$defs/RunFacet") and best["_producer"]
    job = {k: Serde.to_dict(f) for k, f in built.job_facets.items()}
    assert job[TRIALS_RUN_FACET]["trialsDb"] == "sqlite:////t.db"
    assert job[TRAINABLE_FACET]["searchSpace"] == RUN.search_space


def test_without_the_openlineage_provider_the_package_imports_and_builds_dags(monkeypatch):
    """The provider uninstalled, simulated: importing it (or the OpenLineage client) fails."""
    blocked = ("airflow.providers.openlineage", "openlineage")
    # Fresh imports of the package, and none of the provider's modules left loaded; monkeypatch
    # puts every one back afterwards.
    for name in [m for m in sys.modules if m.startswith(("airflow_trials.", *blocked))]:
        monkeypatch.delitem(sys.modules, name)
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # `import name...` raises ImportError
    with pytest.raises(ImportError):
        importlib.import_module("airflow.providers.openlineage.conf")
    fresh = importlib.import_module("airflow_trials.operators.lineage")
    assert fresh.openlineage_enabled() is False  # the sweep ends in its trigger as before
    experiment = importlib.import_module("airflow_trials.experiment")
    from airflow.sdk import DAG

    from airflow_trials.core.search import grid_search

    with DAG("no_lineage", schedule=None) as dag:
        experiment.tuning_experiment(
            experiment_name="no_lineage",
            trainable="tests.trainables:counting",
            search_space={"scale": grid_search([1.0])},
            metric="score",
            group_id="tune",
        )
    assert type(dag.get_task("tune.select_best")).__name__ == "SelectBestOperator"
