"""Issue 27: the checkpoint that the trials DB names for a retry to resume from is still on the
storage when the retry comes, however far the trials trained on while nobody recorded them.
Issue 50: the retry resumes from the newest checkpoint on the storage instead, and records the
results the trials DB missed from that checkpoint's metadata; at most one iteration is re-run.

With ``keep_checkpoints_num`` a trial actor drops its older checkpoints as it makes newer ones.
Only the trigger that polls the actor writes its checkpoints to the trials DB, and a retried trial
resumes from the DB's latest. Each case stops that writer (the whole Airflow stack, or the
triggerer), lets the trials train on unwatched until the keep policy has dropped the checkpoint
the DB names, and then loses the actors (the Ray head stopped, or the actor processes killed), so
that every trial must resume from that checkpoint. Code that deleted a checkpoint as soon as it
was dropped failed every retry with "Could not load checkpoint ...: no such directory" until
``max_failures`` was spent, and the trials ended ERROR.

Each case then proves: the DAG run succeeds; every trial ends TERMINATED at its full iteration
count with its stored results exactly 1..N; it resumed from its newest saved checkpoint, and no
failure was counted for a missing checkpoint; no live checkpoint row of the DB names a directory
that is gone; and the storage holds the trial's last ``keep`` checkpoints and at most one more, none
left by the lost incarnation (a dropped checkpoint is deleted once the DB recorded it dropped, and
the resume deletes what the lost actor dropped and left).

The module has a stack of its own, run once with the trials DB on SQLite and once on PostgreSQL
(AIRFLOW_TRIALS_TEST_POSTGRES_URL; skipped with the reason when unset): the stack-stopped case on
both, each way of killing the actors on one.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_trials import mainjob
from tests.faults.conftest import HOLD_AT, ExperimentRun, SharedStack, _sqlite_trials_db
from tests.faults.stack import AIRFLOW_COMPONENTS, NAMESPACE, FaultStack, actor_dead
from tests.faults.trainables import read_journal

pytestmark = pytest.mark.timeout(900)

#: Many iterations, so that the trials make many checkpoints while nobody records them and are
#: still mid-run when their actors are lost.
ITERATIONS = 40
TRIALS = 2


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def trials_db_url(request, tmp_path_factory) -> Iterator[str]:
    """The module's trials DB: a migrated SQLite file, or a new PostgreSQL database (dropped
    afterwards)."""
    if request.param == "sqlite":
        yield _sqlite_trials_db(tmp_path_factory)
        return
    from airflow_trials.store import migrate
    from tests.contract.conftest import new_postgres_database

    with new_postgres_database("at_faults_kept") as database:  # skips, with the reason, when unset
        migrate(database.url)
        yield database.url


@pytest.fixture(scope="module", autouse=True)
def ray_head_as_the_main_job_starts_it() -> Iterator[None]:
    """The module's Ray head stops at once on SIGTERM, as the one ``airflow-trials run`` starts
    (Ray's default drains a node for 30 s first)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    yield
    patch.undo()


@pytest.fixture
def stack(own_stack) -> FaultStack:
    """The module's stack, whole again after whatever an earlier case stopped or killed."""
    SharedStack._heal(own_stack)
    return own_stack


# -- what the store holds, and what the trials did ------------------------------------------------
def latest_recorded(run: ExperimentRun) -> dict[str, Any]:
    """Each trial's latest checkpoint in the trials DB (what a retry resumes from), or None."""
    from airflow_trials.exceptions import TrialNotFoundError

    store = run.store()
    try:
        latest = {}
        for trial_id in run.trial_ids:
            try:
                latest[trial_id] = store.reader.latest_checkpoint(trial_id)
            except TrialNotFoundError:
                latest[trial_id] = None
        return latest
    finally:
        store.dispose()


def trained_to(run: ExperimentRun) -> dict[str, int]:
    """The last iteration each trial's newest incarnation journaled (0: none yet)."""
    trained = {}
    for trial_id in run.trial_ids:
        incarnations = read_journal(run.journal_dir, trial_id)
        trained[trial_id] = (
            incarnations[-1].iterations[-1] if incarnations and incarnations[-1].iterations else 0
        )
    return trained


def hold_with_checkpoint_recorded(run: ExperimentRun) -> dict[str, str]:
    """Wait until every trial holds at HOLD_AT, deferred, and the trials DB names that iteration's
    checkpoint as its latest; returns those checkpoints' paths by trial."""
    run.wait_until_trials_deferred()

    def recorded() -> dict[str, str]:  # empty until then
        latest = latest_recorded(run)
        if all(c is not None and c.iteration == HOLD_AT for c in latest.values()):
            return {t: c.path for t, c in latest.items()}
        return {}

    return run.stack.wait_for(
        recorded, 120, f"the checkpoint at iteration {HOLD_AT} of every trial to be recorded"
    )


def train_on_unwatched(run: ExperimentRun, keep: int, recorded: dict[str, str]) -> None:
    """Open the gate and wait until every trial has trained far enough that its keep policy
    dropped the checkpoint the trials DB names; then prove that nobody recorded it meanwhile.

    The trainable reports in lockstep with its actor: it journals iteration ``n + 1`` only after
    the actor persisted checkpoint ``n`` and handled what that pushed out. So once iteration
    ``HOLD_AT + keep + 1`` is journaled, checkpoints ``HOLD_AT + 1 .. HOLD_AT + keep`` exist and
    the recorded one (``HOLD_AT``) is no longer among the ``keep`` newest: the actor dropped it.
    """
    run.open_gate()
    past = HOLD_AT + keep + 1
    run.stack.wait_for(
        lambda: min(trained_to(run).values()) >= past,
        120,
        f"every trial to train to iteration {past} unwatched",
    )
    # The situation of the issue: the DB's latest checkpoint is one the actor dropped.
    latest, trained = latest_recorded(run), trained_to(run)
    for trial_id in run.trial_ids:
        assert latest[trial_id].path == recorded[trial_id], (trial_id, latest[trial_id])
        assert trained[trial_id] > latest[trial_id].iteration + keep, (trial_id, trained[trial_id])
    assert run.progress() == dict.fromkeys(run.trial_ids, HOLD_AT), (
        "something recorded the unwatched results"
    )


# -- the proofs
# --------------------------------------------------------------------------------------
def assert_run_succeeds(run: ExperimentRun) -> None:
    """The DAG run ends in success; else the failure says how each trial ended."""
    state = run.finish()
    if state == "success":
        return
    store = run.store()
    try:
        ends = {
            t: (r.status.value, r.num_failures, (r.error_msg or "").splitlines()[:1])
            for t in run.trial_ids
            for r in [store.reader.get_trial(t)]
        }
    finally:
        store.dispose()
    raise AssertionError(
        f"Run {run.run_id} of {run.dag_id} ended {state}; its trials (status, failures, "
        f"error): {ends}"
    )


def assert_resumed_from_the_newest_saved_checkpoint(run: ExperimentRun, num_failures: int) -> None:
    """Every trial finished, resumed once from the newest checkpoint its lost incarnation saved,
    not from the one the trials DB had recorded (issue 50): at most one iteration is trained
    twice, since the trainable journals iteration ``n + 1`` only after its actor persisted
    checkpoint ``n``. ``num_failures`` failures are counted (the fault's own, never one for a
    missing checkpoint), and the stored results are exactly 1..N, the unrecorded ones backfilled
    from the checkpoints' metadata."""
    run.assert_no_lost_results()
    for trial_id, incarnations in run.assert_no_duplicate_trial().items():
        assert len(incarnations) == 2, (trial_id, incarnations)  # the lost one and the resumed one
        lost, resumed = incarnations
        assert resumed.resumed_from >= lost.iterations[-1] - 1 > HOLD_AT, (trial_id, incarnations)
    records = run.assert_trials_end("TERMINATED")
    assert {t: (r.num_failures, r.error_msg) for t, r in records.items()} == dict.fromkeys(
        run.trial_ids, (num_failures, None)
    )
    run.assert_experiment_run("SUCCESS")
    run.stack.assert_triggerer_responsive(since=run.triggered_at)
    for ti in run.trial_tis():
        trial_id = run.trial_ids[ti["map_index"]]
        logs = "\n".join(run.log(ti, try_number=n) for n in range(1, ti["try_number"] + 1))
        assert "Could not load checkpoint" not in logs, logs
        assert f"Trial {trial_id} resumes from checkpoint" in logs, logs


def assert_checkpoints_consistent(run: ExperimentRun, keep: int) -> None:
    """No live checkpoint row names a directory that is gone, the final checkpoint is live, and
    the storage holds the trial's last ``keep`` checkpoints and at most one more, none of them
    from the lost incarnation.

    The lost incarnation's checkpoints: the resume deletes the ones its actor had dropped and not
    yet deleted, whether the trials DB recorded the drop or not (it deletes a dropped one only
    once a poll tells it the drop was recorded, and the loss came first); the resumed incarnation
    takes the recorded ones and the newer saved ones as its own and drops and deletes them in
    turn. The one more: a checkpoint dropped at the last result, whose deletion at the trial's end
    is best effort. A trial that deleted nothing would hold ``ITERATIONS``; before the resume
    deleted the lost actor's leftovers, how many stayed depended on how far its watcher lagged.
    """
    from airflow_trials.store import TrialReader

    store = TrialReader(run.stack.trials_db_url)
    try:
        rows = store.checkpoints_of(run.trial_ids)
    finally:
        store.dispose()
    for trial_id in run.trial_ids:
        live = [r for r in rows[trial_id] if not r.deleted]
        assert [r.path for r in live if not os.path.isdir(r.path)] == [], (trial_id, rows[trial_id])
        assert max(r.iteration for r in live) == run.iterations, (trial_id, live)
        on_disk = sorted(
            p.name for p in (run.stack.storage / run.dag_id / trial_id).glob("checkpoint_*")
        )
        resumed_from = read_journal(run.journal_dir, trial_id)[-1].resumed_from
        from_the_lost_one = [n for n in on_disk if int(n.rsplit("_", 1)[1]) <= resumed_from]
        assert from_the_lost_one == [], (trial_id, resumed_from, on_disk)
        assert keep <= len(on_disk) <= keep + 1, (trial_id, on_disk)


# -- faults
# ------------------------------------------------------------------------------------------
def stop_ray_as_the_main_job_does(stack: FaultStack) -> None:
    """SIGTERM the Ray head's process group (SIGKILL what is left of it after 30 s), as
    ``airflow-trials run`` stops the head it started; then SIGKILL the head's workers, which sit
    in process groups of their own."""
    assert stack.ray.proc is not None
    stack.ray.disconnect()  # a driver whose GCS vanishes is aborted by Ray
    mainjob._stop_group(stack.ray.proc)
    stack.ray.kill()


def actor_processes(run: ExperimentRun, stack: FaultStack) -> dict[str, int]:
    """The process running each trial now (its newest incarnation), checked to be one of this
    stack's Ray head: a function trainable runs in its actor's process."""
    ours = {proc.pid for proc in stack.ray.processes()}
    pids = {trial_id: read_journal(run.journal_dir, trial_id)[-1].pid for trial_id in run.trial_ids}
    assert set(pids.values()) <= ours, (pids, sorted(ours))
    return pids


# -- the cases
# -----------------------------------------------------------------------------------------
def test_trials_resume_after_the_stack_and_ray_stopped_while_they_trained_unwatched(
    stack, experiment
):
    """Ctrl-C of the main job: Airflow stopped (SIGTERM) while the trials train on unwatched, then
    the Ray head stopped; both started again."""
    keep = 2
    run = experiment(
        "ckpt_kept_stack_stopped",
        trials=TRIALS,
        iterations=ITERATIONS,
        max_failures=1,
        keep_checkpoints_num=keep,
    )
    run.trigger()
    recorded = hold_with_checkpoint_recorded(run)
    # As the main job stops Airflow: SIGTERM, then SIGKILL for what has not exited after 30 s
    # (whether each exits on SIGTERM alone is test_stack_restart.py's subject, not this one's).
    exit_codes = stack.stop(timeout_s=30)
    assert set(exit_codes) == set(AIRFLOW_COMPONENTS)
    train_on_unwatched(run, keep, recorded)
    stop_ray_as_the_main_job_does(stack)
    stack.ray.start()
    stack.start()
    assert_run_succeeds(run)

    # Lost with the Ray head: not a failure of the trial, and the retry finds its checkpoint.
    assert_resumed_from_the_newest_saved_checkpoint(run, num_failures=0)
    for ti in run.trial_tis():
        tries = stack.tries(run.dag_id, run.run_id, run.trial_task, ti["map_index"])
        assert [t["state"] for t in tries] == ["failed"] * (len(tries) - 1) + ["success"], tries
    assert_checkpoints_consistent(run, keep)


#: How the actors die on each trials DB (the module runs once per DB): each way of killing them
#: runs on one DB, not both, since the store's writes are the same on either (tests/contract proves
#: it); each DB still sees the stack stopped and the actors killed. ``keep`` is the trials'
#: keep_checkpoints_num.
ACTOR_KILLS = {"sqlite": (2, "sigkill"), "postgresql": (1, "ray_kill")}


def test_trials_resume_after_their_actors_died_while_no_triggerer_ran(stack, experiment, request):
    """The triggerer SIGKILLed, the trials train on unwatched, their actors are killed (the
    processes SIGKILLed on SQLite, ``ray.kill`` on PostgreSQL: ``ACTOR_KILLS``), and then a new
    triggerer starts."""
    import ray

    keep, kill = ACTOR_KILLS[request.node.callspec.params["trials_db_url"]]

    run = experiment(
        f"ckpt_kept_actors_killed_keep{keep}",
        trials=TRIALS,
        iterations=ITERATIONS,
        max_failures=1,
        keep_checkpoints_num=keep,
    )
    run.trigger()
    recorded = hold_with_checkpoint_recorded(run)
    stack.kill("triggerer")
    train_on_unwatched(run, keep, recorded)
    actors = {t: ray.get_actor(run.actor_name(t), namespace=NAMESPACE) for t in run.trial_ids}
    if kill == "sigkill":
        for pid in actor_processes(run, stack).values():
            os.kill(pid, signal.SIGKILL)
    else:
        for actor in actors.values():
            ray.kill(actor, no_restart=True)
    stack.wait_for(
        lambda: all(actor_dead(actor) for actor in actors.values()),
        120,
        "every trial's actor to be dead",
    )
    stack.start("triggerer")
    assert_run_succeeds(run)

    # The kill is the trial's one failure (max_failures=1): its retry resumes it and succeeds.
    assert_resumed_from_the_newest_saved_checkpoint(run, num_failures=1)
    run.assert_tasks_end(tries=dict.fromkeys(range(TRIALS), ["failed", "success"]))
    assert_checkpoints_consistent(run, keep)


def test_trials_resume_after_a_power_loss_while_they_trained(stack, experiment):
    """A power loss: every process of the stack SIGKILLed while the trials train and their
    triggers record (Airflow's components, the Ray head and its workers, the actors with it), then
    all started again. Each trial re-runs at most one iteration beyond what had reached its
    storage, and the loss spends no ``max_failures`` (``max_failures=0``)."""
    run = experiment(
        "ckpt_kept_power_loss",
        trials=TRIALS,
        iterations=ITERATIONS,
        max_failures=0,
        keep_checkpoints_num=2,
    )
    run.trigger()
    hold_with_checkpoint_recorded(run)
    run.open_gate()
    past = HOLD_AT + 4
    stack.wait_for(
        lambda: min(trained_to(run).values()) >= past,
        120,
        f"every trial to train to iteration {past}, watched",
    )
    for name in AIRFLOW_COMPONENTS:
        stack.kill(name)
    stack.ray.kill()
    stack.ray.start()
    stack.start()
    assert_run_succeeds(run)

    # Lost with the head: no failure of the trial; resumed from what reached the storage.
    assert_resumed_from_the_newest_saved_checkpoint(run, num_failures=0)
    assert_checkpoints_consistent(run, keep=2)
