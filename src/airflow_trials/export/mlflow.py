"""Export an experiment run from the trials DB to MLflow: a parent run for the experiment run,
one child run per trial (its config, every reported metric at its step, its status and stop
reason, its best checkpoint), updated in place when exported again. mlflow is imported here
only when an export starts: the ``mlflow`` extra (``INSTALL_HINT``)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import posixpath
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_trials.exceptions import ExportError
from airflow_trials.export.checkpoint_staging import checkpoint_bytes, local_checkpoint
from airflow_trials.export.mlflow_client import INSTALL_HINT, mlflow_client  # noqa: F401
from airflow_trials.export.mlflow_mapping import (
    CHECKPOINT_ARTIFACT_TAG,
    CHECKPOINT_TAG,
    EXPERIMENT_RUN,
    EXPERIMENT_TAG,
    EXPORTED_ITERATION_TAG,
    KIND_TAG,
    MAX_PARAMS_TAGS_PER_BATCH,
    PARENT_RUN_TAG,
    RUN_KEY_TAG,
    STATUS_TAG,
    STOP_KIND_TAG,
    STOP_REASON_TAG,
    TRIAL,
    TRIAL_ID_TAG,
    MlflowExport,
    batches,
    changed,
    metric_batches,
    metric_points,
    param_values,
    run_status,
    tag_value,
)
from airflow_trials.storage.storage_root import is_inside

if TYPE_CHECKING:
    from airflow_trials.store import TrialReader
    from airflow_trials.store.board import Board
    from airflow_trials.store.records import ExperimentRunRecord, TrialRecord

log = logging.getLogger(__name__)

_SEARCH_PAGE = 1000


@dataclasses.dataclass(frozen=True)
class MlflowExportSummary:
    """What one export did; a retried export of an unchanged run creates and logs nothing.

    :param tracking_uri: the MLflow tracking server.
    :param experiment_id: the MLflow experiment's id.
    :param experiment_name: the MLflow experiment's name.
    :param parent_run_id: the MLflow run of the experiment run.
    :param trials: the trials exported, one child run each.
    :param runs_created: MLflow runs created (the parent's included).
    :param runs_updated: MLflow runs that existed and were sent something.
    :param params_logged: params logged, over every run.
    :param metrics_logged: metric points logged, over every run.
    :param artifacts_logged: checkpoints logged as artifacts.
    :param checkpoints_referenced: best checkpoints only referenced by their URI (tag
        ``airflow_trials.best_checkpoint``): not asked for, too large, or not found.
    :param notes: what the export could not do as asked, one line each.
    """

    tracking_uri: str
    experiment_id: str
    experiment_name: str
    parent_run_id: str
    trials: int
    runs_created: int
    runs_updated: int
    params_logged: int
    metrics_logged: int
    artifacts_logged: int
    checkpoints_referenced: int
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def export_to_mlflow(
    reader: TrialReader,
    run: ExperimentRunRecord,
    export: MlflowExport,
    storage_root: str | None = None,
) -> MlflowExportSummary:
    """Export ``run`` and its trials, as the trials DB holds them now, to MLflow.

    The experiment run is a parent run (found again by the tags ``airflow_trials.experiment``
    and ``airflow_trials.run_key``), each trial a child run (found by ``airflow_trials.trial_id``
    under that parent). A retried export updates these runs: params and tags not yet there,
    metric points after the last training_iteration it logged (the tag
    ``airflow_trials.exported_iteration``), statuses and checkpoints that changed.

    :param reader: the trials DB, read-only (a TrialStore reads too).
    :param run: the experiment run, e.g. ``reader.resolve_run("mnist", "latest")``.
    :param export: where and how (:class:`~airflow_trials.export.mlflow_mapping.MlflowExport`).
    :param storage_root: the storage root the trials wrote to; a checkpoint the trials DB names
        outside it is referenced, never read or uploaded. Default: the configured root.
    :raises ExportError: mlflow is not installed, no tracking URI is set, or MLflow refused
        or did not answer.
    """
    from airflow_trials.store.engine import mask_passwords

    client, uri = mlflow_client(export.tracking_uri)  # first: it names the extra if mlflow is gone
    from mlflow.exceptions import MlflowException

    subject = (
        f"run {run.run_key} (id {run.id}) of experiment {run.experiment_name} to MLflow at {uri}"
    )
    try:
        from airflow_trials.storage.trial_storage import configured_storage_root

        root = storage_root or configured_storage_root()
        return _RunExport(reader, run, export, client, uri, root).export()
    except MlflowException as e:
        # MLflow's message names the URI as given: mask it, in the cause that is chained too.
        e.message = mask_passwords(e.message)
        e.args = (e.message,)
        raise ExportError(
            f"Exporting {subject} failed: {e.message.strip().splitlines()[0]}. Check that the "
            "tracking server answers and accepts runs, then export again: what was logged "
            "already is kept, not logged twice."
        ) from e


class _RunExport:
    """One export of one experiment run: the parent, then each trial in turn."""

    def __init__(
        self,
        reader: TrialReader,
        run: ExperimentRunRecord,
        export: MlflowExport,
        client: Any,
        uri: str,
        storage_root: str,
    ) -> None:
        self.reader = reader
        self.storage_root = storage_root
        self.run = run
        self.settings = export
        self.client = client
        self.uri = uri
        self.counts = dict.fromkeys(("created", "params", "metrics", "artifacts", "referenced"), 0)
        self.updated: set[str] = set()  # a run sent several things in one export counts once
        self.notes: list[str] = []

    def export(self) -> MlflowExportSummary:
        experiment_name = self.settings.experiment_name or self.run.experiment_name
        experiment_id = self._experiment_id(experiment_name)
        trials = self.reader.list_trials(experiment_run_id=self.run.id)
        board = self._board()
        best_trial = exported_best(self.run, board)
        checkpoints = self._best_checkpoints([t.trial_id for t in trials], board)
        parent = self._parent(experiment_id, best_trial)
        children = self._children(experiment_id, parent)
        for trial in trials:
            logged = self.settings.checkpoints == "all" or (
                self.settings.checkpoints == "best" and trial.trial_id == best_trial
            )
            self._trial(
                experiment_id,
                parent,
                trial,
                children.get(trial.trial_id),
                checkpoints.get(trial.trial_id),
                logged,
            )
        return MlflowExportSummary(
            tracking_uri=self.uri,
            experiment_id=experiment_id,
            experiment_name=experiment_name,
            parent_run_id=parent,
            trials=len(trials),
            runs_created=self.counts["created"],
            runs_updated=len(self.updated),
            params_logged=self.counts["params"],
            metrics_logged=self.counts["metrics"],
            artifacts_logged=self.counts["artifacts"],
            checkpoints_referenced=self.counts["referenced"],
            notes=self.notes,
        )

    # -- what the trials DB says ------------------------------------------------------------

    def _board(self) -> Board | None:
        """The run's board by its experiment's goal (store/board.py); None without a metric and
        mode recorded."""
        goal = self.reader.get_experiment(self.run.experiment_name).goal
        if not goal.metrics or None in goal.modes:
            return None
        return self.reader.board(self.run.id, goal)

    def _best_checkpoints(self, trial_ids: list[str], board: Board | None) -> dict[str, str]:
        """Each trial's checkpoint to hand on, as its board row gives it (select_best's); without
        a metric, its newest kept one."""
        if board is not None:
            return {r.trial_id: r.best_checkpoint for r in board.rows if r.best_checkpoint}
        newest: dict[str, str] = {}
        for trial_id, kept in self.reader.checkpoints_of(trial_ids).items():
            live = [c for c in kept if not c.deleted]
            if live:
                newest[trial_id] = live[-1].path
        return newest

    # -- MLflow ------------------------------------------------------------------------------

    def _experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is None:
            return str(self.client.create_experiment(name))
        if found.lifecycle_stage == "deleted":
            raise ExportError(
                f"MLflow experiment {name!r} (id {found.experiment_id}) at {self.uri} is deleted; "
                "restore it (mlflow experiments restore), or export to another experiment "
                "(--mlflow-experiment, MlflowExport(experiment_name=...))."
            )
        return str(found.experiment_id)

    def _search(self, experiment_id: str, filter_string: str) -> Iterator[Any]:
        token = None
        while True:
            page = self.client.search_runs(
                [experiment_id], filter_string, max_results=_SEARCH_PAGE, page_token=token
            )
            yield from page
            token = page.token
            if not token:
                return

    def _parent(self, experiment_id: str, best_trial: str | None) -> str:
        run = self.run
        found = next(
            (
                r
                for r in self._search(
                    experiment_id,
                    f"tags.`{KIND_TAG}` = '{EXPERIMENT_RUN}' and "
                    f"tags.`{EXPERIMENT_TAG}` = '{run.experiment_name}'",
                )
                if r.data.tags.get(RUN_KEY_TAG) == run.run_key
            ),
            None,
        )
        from airflow_trials.store.engine import safe_url

        tags = {
            KIND_TAG: EXPERIMENT_RUN,
            EXPERIMENT_TAG: run.experiment_name,
            RUN_KEY_TAG: run.run_key,
            "airflow_trials.experiment_run_id": str(run.id),
            STATUS_TAG: run.status.value,
            "airflow_trials.trials_db": safe_url(self.reader.url),
        }
        if run.dag_id is not None:
            tags["airflow_trials.dag_id"] = run.dag_id
        if run.run_id is not None:
            tags["airflow_trials.dag_run_id"] = run.run_id
        if best_trial is not None:
            tags["airflow_trials.best_trial_id"] = best_trial
        params: dict[str, Any] = {"num_samples": run.num_samples, "seed": run.seed}
        if isinstance(run.search_space, Mapping):
            params.update({f"search_space/{k}": v for k, v in run.search_space.items()})
        experiment = self.reader.get_experiment(run.experiment_name)
        params.update(metric=experiment.metric, mode=experiment.mode)
        values = param_values({k: v for k, v in params.items() if v is not None})
        return self._update(
            experiment_id,
            found,
            run_name=run.run_key,
            tags={k: tag_value(v) for k, v in tags.items()},
            params=values,
            status=run_status(run.status.value),
            start_time=_millis(run.created_at),
            end_time=_millis(run.ended_at),
            subject=f"experiment run {run.run_key}",
        )

    def _children(self, experiment_id: str, parent: str) -> dict[str, Any]:
        children: dict[str, Any] = {}
        for child in self._search(experiment_id, f"tags.`{PARENT_RUN_TAG}` = '{parent}'"):
            trial_id = child.data.tags.get(TRIAL_ID_TAG)
            if trial_id is not None:
                children.setdefault(trial_id, child)
        return children

    def _trial(
        self,
        experiment_id: str,
        parent: str,
        trial: TrialRecord,
        found: Any,
        checkpoint: str | None,
        log_checkpoint: bool,
    ) -> None:
        tags = {
            KIND_TAG: TRIAL,
            PARENT_RUN_TAG: parent,
            EXPERIMENT_TAG: self.run.experiment_name,
            RUN_KEY_TAG: self.run.run_key,
            TRIAL_ID_TAG: trial.trial_id,
            STATUS_TAG: trial.status.value,
            "airflow_trials.trainable": trial.trainable,
            "airflow_trials.num_failures": str(trial.num_failures),
        }
        if trial.stop_reason:
            tags[STOP_REASON_TAG] = trial.stop_reason
        if trial.stop_kind is not None:
            tags[STOP_KIND_TAG] = trial.stop_kind.value
        if trial.error_msg:
            tags["airflow_trials.error"] = trial.error_msg.strip().splitlines()[-1]
        if checkpoint is not None:
            tags[CHECKPOINT_TAG] = checkpoint
        run_id = self._update(
            experiment_id,
            found,
            run_name=trial.trial_id,
            tags={k: tag_value(v) for k, v in tags.items()},
            params=param_values(trial.config),
            status=run_status(trial.status.value),
            start_time=_millis(trial.started_at or trial.created_at),
            end_time=_millis(trial.ended_at),
            subject=f"trial {trial.trial_id}",
        )
        present = found.data.tags if found is not None else {}
        sent_metrics = self._metrics(run_id, trial, int(present.get(EXPORTED_ITERATION_TAG, 0)))
        sent_artifact = False
        if checkpoint is not None and log_checkpoint:
            sent_artifact = self._checkpoint(run_id, trial.trial_id, checkpoint, present)
        elif checkpoint is not None:
            self.counts["referenced"] += 1
        if found is not None and (sent_metrics or sent_artifact):
            self.updated.add(run_id)

    def _update(
        self,
        experiment_id: str,
        found: Any,
        *,
        run_name: str,
        tags: dict[str, str],
        params: dict[str, str],
        status: str | None,
        start_time: int | None,
        end_time: int | None,
        subject: str,
    ) -> str:
        """Create the run, or send it the tags and params it lacks and the status it should
        have; its id."""
        from mlflow.entities import Param, RunTag

        if found is None:
            created = self.client.create_run(
                experiment_id, start_time=start_time, tags=tags, run_name=run_name
            )
            self.counts["created"] += 1
            run_id = str(created.info.run_id)
            present_tags: dict[str, str] = dict(created.data.tags)
            present_params: dict[str, str] = {}
            info_status, info_end = created.info.status, created.info.end_time
        else:
            run_id = str(found.info.run_id)
            present_tags, present_params = dict(found.data.tags), dict(found.data.params)
            info_status, info_end = found.info.status, found.info.end_time
        new_params = {k: v for k, v in params.items() if k not in present_params}
        for key in sorted(set(params) & set(present_params)):
            if params[key] != present_params[key]:
                self.notes.append(
                    f"{subject}: param {key} is {params[key]!r} in the trials DB but was logged "
                    f"as {present_params[key]!r} (MLflow params cannot change); left as logged."
                )
        new_tags = changed(tags, present_tags)
        entries: list[Any] = [Param(k, v) for k, v in new_params.items()]
        entries += [RunTag(k, v) for k, v in new_tags.items()]
        for batch in batches(entries, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(
                run_id,
                params=[e for e in batch if isinstance(e, Param)],
                tags=[e for e in batch if isinstance(e, RunTag)],
            )
        self.counts["params"] += len(new_params)
        terminate = status is not None and (info_status != status or info_end != end_time)
        if terminate:
            # set_terminated prints the run's URL on stdout, where the CLI writes its rows.
            with contextlib.redirect_stdout(io.StringIO()):
                self.client.set_terminated(run_id, status, end_time=end_time)
        if found is not None and (entries or terminate):
            self.updated.add(run_id)
        return run_id

    def _metrics(self, run_id: str, trial: TrialRecord, exported: int) -> int:
        """Log the trial's results after training_iteration ``exported``; how many points."""
        from mlflow.entities import Metric, RunTag

        last = (trial.last_result or {}).get("training_iteration")
        if not isinstance(last, int) or last <= exported:
            return 0  # nothing new: the results are not read
        points = metric_points(self.reader.get_results(trial.trial_id), exported)
        sent = 0
        for batch, watermark in metric_batches(points):
            tags = [] if watermark is None else [RunTag(EXPORTED_ITERATION_TAG, str(watermark))]
            self.client.log_batch(
                run_id,
                metrics=[Metric(key, value, millis, step) for key, value, millis, step in batch],
                tags=tags,
            )
            sent += len(batch)
        if not points:  # results without a number: still, they need not be read again
            self.client.set_tag(run_id, EXPORTED_ITERATION_TAG, str(last))
        self.counts["metrics"] += sent
        return sent

    def _checkpoint(
        self, run_id: str, trial_id: str, checkpoint: str, present: Mapping[str, str]
    ) -> bool:
        """Log the checkpoint as the artifact ``checkpoints/<its name>`` unless it is there or
        too large (then it is only referenced); whether it was logged now."""
        artifact_path = posixpath.join("checkpoints", posixpath.basename(checkpoint.rstrip("/")))
        if present.get(CHECKPOINT_ARTIFACT_TAG) == artifact_path:
            return False
        root = self.storage_root
        why = None if is_inside(checkpoint, root) else f"outside the storage root {root}"
        limit = self.settings.max_artifact_bytes
        try:
            size = 0 if why else checkpoint_bytes(checkpoint)
        except FileNotFoundError:
            why = "not on the storage any more"
        if why is None and size > limit:
            why = f"{size} bytes, more than max_artifact_bytes {limit}"
        if why is not None:
            self.counts["referenced"] += 1
            self.notes.append(
                f"trial {trial_id}: best checkpoint {checkpoint} is {why}; referenced by its URI "
                f"(tag {CHECKPOINT_TAG}), not logged."
            )
            return False
        skipped: list[str] = []
        with local_checkpoint(checkpoint, skipped) as local:
            if os.path.isdir(local):
                self.client.log_artifacts(run_id, local, artifact_path)
            else:
                self.client.log_artifact(run_id, local, posixpath.dirname(artifact_path))
        if skipped:
            self.notes.append(
                f"trial {trial_id}: {len(skipped)} entries of checkpoint {checkpoint} were not "
                f"logged (symlinks, not regular files, or names outside it): "
                f"{', '.join(skipped)}."
            )
        self.client.set_tag(run_id, CHECKPOINT_ARTIFACT_TAG, artifact_path)
        self.counts["artifacts"] += 1
        log.info("Logged checkpoint %s of trial %s as %s", checkpoint, trial_id, artifact_path)
        return True


def _millis(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def exported_best(run: ExperimentRunRecord, board: Board | None) -> str | None:
    """The trial the export marks best: the one select_best picked, else the best of the run's
    board (a trial that ended TERMINATED, feasible first: docs/store.md "Which trials count");
    None when none counts or the experiment has no metric."""
    if run.picked_trial_id is not None:
        return run.picked_trial_id
    return None if board is None else board.best_trial_id
