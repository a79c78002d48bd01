"""Bad params for the UI-triggered experiment, sent through Airflow's REST API to a real stack.

One stack serves the module (``tests/faults/_rest.py``): api-server, scheduler, dag-processor and
triggerer as real processes in a temporary AIRFLOW_HOME, the trials DB on a temporary SQLite file
and, when AIRFLOW_TRIALS_TEST_POSTGRES_URL is set, on a fresh PostgreSQL schema (through the
``trials_default`` connection). Each backend gets one batch: every bad input is triggered at once
and the runs are awaited together. Each test then checks one input: either the REST API refuses
it with the param's name and no DAG run exists, or the run fails in ``suggest_configs`` with a
message naming the run, the param, the bad value and the fix. Either way the trials DB holds no
experiment run and no trial for it, and Ray no trial actor. A valid run in the same batch shows
that these checks see what a run writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_trials.experiment import trial_ids
from tests.conftest import REPO, live_trial_actors, remove_leftovers, start_ray
from tests.faults._rest import RestStack, start_stack

pytestmark = pytest.mark.timeout(900)

DAG_ID = EXPERIMENT = "ui_regression_tuning"
SUGGEST = f"{EXPERIMENT}.suggest_configs"
NAN, INF = float("nan"), float("inf")
REFUSED = f"Experiment {EXPERIMENT}, DAG run {{run_id}}: the run's params are refused: "
FIX = "No trial was started and nothing was written; trigger the DAG again with corrected params."
VALID = {"num_samples": 1, "epochs": 1}


@dataclass(frozen=True)
class Case:
    """One bad input and where it must be refused.

    :param conf: the DAG run's ``conf``.
    :param refused_by: ``"api"`` (the trigger answers 4xx) or ``"run"`` (``suggest_configs`` fails).
    :param expect: texts the REST API's ``detail`` or ``suggest_configs``' log must contain.
    :param run_id: a run id of its own; default ``<backend>__<case>``.
    """

    conf: dict[str, Any]
    refused_by: str
    expect: tuple[str, ...]
    run_id: str | None = None


CASES = {
    "path_traversal_in_run_id": Case(
        {}, "api", ("run_id '../../../tmp/evil' must not contain '..'",), run_id="../../../tmp/evil"
    ),
    "slash_in_run_id": Case(
        {},
        "api",
        ("The run_id provided 'tmp/evil' does not match regex pattern",),
        run_id="tmp/evil",
    ),
    "path_traversal_in_metric": Case(
        {"metric": "../../../tmp/evil"},
        "api",
        ("param metric", "'../../../tmp/evil' is not one of"),
    ),
    "huge_number_of_trials": Case(
        {"num_samples": 100_000},
        "api",
        ("param num_samples", "100000 is greater than the maximum of 32"),
    ),
    "nan_token": Case(
        {"lr_min": NAN},
        "api",
        ("param lr_min", "nan should not be valid", "NaN is not a number: send a finite number"),
    ),
    "nan_token_weight_decay": Case(
        {"l2_max": NAN}, "api", ("param l2_max", "nan should not be valid")
    ),
    "nan_string": Case({"lr_max": "NaN"}, "api", ("param lr_max", "'NaN' is not of type 'number'")),
    "infinity": Case(
        {"lr_max": INF}, "api", ("param lr_max", "inf is greater than the maximum of 10")
    ),
    "negative_bound": Case(
        {"lr_min": -0.1}, "api", ("param lr_min", "-0.1 is less than or equal to the minimum of 0")
    ),
    "zero_bound": Case(
        {"lr_max": 0}, "api", ("param lr_max", "0 is less than or equal to the minimum of 0")
    ),
    "string_for_number": Case(
        {"lr_min": "0.1"}, "api", ("param lr_min", "'0.1' is not of type 'number'")
    ),
    "bool_for_number": Case(
        {"l2_max": True}, "api", ("param l2_max", "True is not of type 'number'")
    ),
    "fraction_for_count": Case(
        {"num_samples": 2.5}, "api", ("param num_samples", "2.5 is not of type 'integer'")
    ),
    "float_for_count": Case(
        {"num_samples": 4.0},
        "run",
        ("param num_samples is 4.0, a float, but it must be an integer; send 4",),
    ),
    "float_for_epochs": Case(
        {"epochs": 3.0}, "run", ("param epochs is 3.0, a float, but it must be an integer; send 3",)
    ),
    "bounds_in_wrong_order": Case(
        {"lr_min": 0.5, "lr_max": 0.1},
        "run",
        ("lr_min (0.5) must be below lr_max (0.1); lower lr_min or raise lr_max",),
    ),
    "equal_bounds": Case(
        {"lr_min": 0.1, "lr_max": 0.1}, "run", ("lr_min (0.1) must be below lr_max (0.1)",)
    ),
    "extra_keys_choose_the_trainable": Case(
        {
            "trainable": "os:system",
            "search_space": {"lr": {"uniform": [0, 1]}},
            "experiment_name": "../../../tmp/evil",
        },
        "run",
        (
            "conf keys ['experiment_name', 'search_space', 'trainable'] are not params of this DAG "
            "and would be "
            "ignored",
            "the trigger form accepts only ['epochs', 'extend_num_samples', 'extend_run', "
            "'extend_stop', 'gpus_per_trial', 'l2_max', 'lr_max', 'lr_min', 'max_failures', "
            "'metric', 'mode', 'num_samples'], so leave out",
        ),
    ),
}


@dataclass
class Batch:
    """One backend's triggered runs: the trigger responses and the final state of each run."""

    backend: str
    store: Any
    run_ids: dict[str, str]
    responses: dict[str, httpx.Response]
    states: dict[str, str]


@pytest.fixture(scope="module")
def ray_address() -> str:
    import ray

    start_ray(num_cpus=2, num_gpus=2)
    return str(ray.get_runtime_context().gcs_address)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, ray_address) -> Iterator[RestStack]:
    rest = start_stack(
        tmp_path_factory.mktemp("faults_stack"), [Path(REPO, "dags", f"{DAG_ID}.py")], ray_address
    )
    yield rest
    rest.stop()
    remove_leftovers()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def trials_db(request, stack) -> Iterator[tuple[str, str]]:
    """(backend, URL) of the trials DB the stack's tasks use: its SQLite file (through
    AIRFLOW_TRIALS_DB_URL), or a fresh PostgreSQL schema (through the trials_default connection)."""
    if request.param == "sqlite":
        yield "sqlite", stack.stack.trials_db_url
        return
    from sqlalchemy import create_engine, text

    from airflow_trials.store import migrate
    from tests.contract.conftest import postgres_url, with_search_path

    base, schema = postgres_url(), f"faults_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = with_search_path(base, schema)
        migrate(url)
        stack.set_connection("trials_default", "trials_db", {"url": url})
        yield "postgresql", url
    finally:
        stack.client.delete("/api/v2/connections/trials_default")
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="module")
def batch(stack, trials_db) -> Iterator[Batch]:
    """Every case and one valid run triggered at once on this backend, awaited together."""
    from airflow_trials.store import TrialStore

    backend, url = trials_db
    run_ids = {name: case.run_id or f"{backend}__{name}" for name, case in CASES.items()}
    run_ids["valid"] = f"{backend}__valid"
    responses = {
        name: stack.trigger(DAG_ID, CASES[name].conf if name in CASES else VALID, run_id)
        for name, run_id in run_ids.items()
    }
    accepted = [
        run_ids[name] for name, response in responses.items() if response.status_code == 200
    ]
    store = TrialStore(url)
    try:
        yield Batch(
            backend, store, run_ids, responses, stack.wait_for_runs(DAG_ID, accepted, timeout_s=600)
        )
    finally:
        store.dispose()


def suggest_log(stack: RestStack, run_id: str, expected: str) -> str:
    """suggest_configs' log from the REST API, once it holds ``expected`` (or the last one read)."""
    seen = {"log": ""}

    def has_it() -> bool:
        seen["log"] = stack.task_log(DAG_ID, run_id, SUGGEST)
        return expected in seen["log"]

    try:
        stack.wait_for(has_it, 60, f"{expected!r} in the log of {SUGGEST} in {run_id}")
    except TimeoutError as e:
        raise AssertionError(f"{e}; the log:\n{seen['log'][-4000:]}") from None
    return seen["log"]


def assert_nothing_recorded(batch: Batch, run_id: str) -> None:
    store = batch.store
    assert [
        r.id for r in store.reader.list_experiment_runs() if run_id in (r.run_key, r.run_id)
    ] == []
    assert [t.trial_id for t in store.reader.list_trials() if t.run_id == run_id] == []
    assert [e.name for e in store.reader.list_experiments()] in ([], [EXPERIMENT])
    prefix = trial_ids(EXPERIMENT, DAG_ID, run_id, 1)[0].rsplit("-", 1)[0]
    assert [name for name in live_trial_actors() if prefix in name] == []


@pytest.mark.parametrize("case", list(CASES))
def test_bad_params_are_refused_before_any_trial_or_write(batch, stack, case):
    bad, run_id, response = CASES[case], batch.run_ids[case], batch.responses[case]
    if bad.refused_by == "api":
        assert 400 <= response.status_code < 500, response.text
        detail = str(response.json()["detail"])
        for text in bad.expect:
            assert text in detail, detail
        assert stack.run_state(DAG_ID, run_id) is None  # no DAG run was created
    else:
        assert response.status_code == 200, response.text
        assert batch.states[run_id] == "failed"
        tasks = stack.task_states(DAG_ID, run_id)
        assert tasks[SUGGEST] == "failed"
        assert {state for task, state in tasks.items() if ".trial_gpu_" in task} == {
            "upstream_failed"
        }
        log = suggest_log(stack, run_id, FIX)
        assert REFUSED.format(run_id=run_id) in log
        for text in bad.expect:
            assert text in log
    assert_nothing_recorded(batch, run_id)


def test_a_valid_run_in_the_same_batch_is_recorded(batch, stack, ray_address):
    """The control: the checks above look at the store, the Ray cluster and the logs the stack
    uses."""
    run_id = batch.run_ids["valid"]
    assert batch.responses["valid"].status_code == 200
    assert batch.states[run_id] == "success", stack.task_states(DAG_ID, run_id)
    (exp_run,) = [
        r for r in batch.store.reader.list_experiment_runs(EXPERIMENT) if r.run_key == run_id
    ]
    (trial,) = batch.store.reader.list_trials(experiment_run_id=exp_run.id)
    assert trial.run_id == run_id and trial.status.value == "TERMINATED"
    assert trial.trial_id == trial_ids(EXPERIMENT, DAG_ID, run_id, 1)[0]
    assert f"Connecting to Ray at {ray_address}" in suggest_log(stack, run_id, "Connecting to Ray")
