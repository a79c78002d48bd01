"""``tuning_experiment(approval=True, approvers=[...])``: Airflow's ApprovalOperator between
``select_best`` and ``publish_best``, the task that emits the best trial's Asset event.

On Airflow 3.3 the approval task waits in the ``awaiting_input`` state (no trigger, no triggerer)
until one of the approvers (Airflow's ``assigned_users``) answers in the UI's Required Actions
page or through the REST API
(``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails``). The
answer is recorded in the trials DB beside the run (who, when, why, who triggered the DAG run, and
what it counts as: ``core/approval_rule.py``). ``publish_best`` publishes only when that record says
approved, by an approver who did not trigger the run (four eyes), and matches the answer
``approve_best`` got in this try: marking ``approve_best`` success, or clearing ``publish_best``
after a "Reject", publishes nothing. A rejection is final.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, task
from airflow.sdk.exceptions import AirflowFailException, DownstreamTasksSkipped

from airflow_trials.core.approval_rule import ApprovalPolicy, refusal
from airflow_trials.hooks.trials import DEFAULT_TRIALS_CONN_ID, TrialsDbHook
from airflow_trials.operators.links import RUN_PAGE, dashboard_url

if TYPE_CHECKING:
    from airflow_trials.experiment.plan import TuningPlan
    from airflow_trials.store import TrialStore
    from airflow_trials.store.records import RunApprovalRecord

APPROVE_TASK_ID = "approve_best"
PUBLISH_TASK_ID = "publish_best"
REASON = "reason"
DECISION_KEY = "decision"


def checked_approval(
    experiment_name: str, approval: object, approvers: object, allow_self_approval: object
) -> ApprovalPolicy | None:
    """The approval policy of ``approval=True``; None without approval. ValueError otherwise: an
    ``approval`` that is not a bool (a string such as ``"no"`` would be taken as true), approval
    without approvers, approvers or ``allow_self_approval`` without approval, or approvers that
    are not user ids."""
    if not isinstance(approval, bool):
        raise ValueError(
            f"Experiment {experiment_name}: approval={approval!r} is not True or False; pass "
            "approval=True to have a person approve the best trial before it is published, or "
            "leave it out."
        )
    if not approval:
        if approvers is not None or allow_self_approval is not False:
            raise ValueError(
                f"Experiment {experiment_name}: approvers and allow_self_approval go with "
                "approval=True; pass approval=True too, or leave them out."
            )
        return None
    try:
        return ApprovalPolicy.of(approvers, allow_self_approval)
    except ValueError as e:
        raise ValueError(f"Experiment {experiment_name}: {e}.") from e


def _num(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _one_metric(best: Mapping[str, Any]) -> list[str]:
    return [
        f"- **Best trial:** `{best['trial_id']}`",
        f"- **{best['metric']}** ({best['mode']}): **{_num(best['value'])}**"
        + (f" at iteration {best['iteration']}" if best.get("iteration") is not None else ""),
    ]


def _several_metrics(best: Mapping[str, Any]) -> list[str]:
    named = [f"{m} ({d})" for m, d in zip(best["metric"], best["mode"], strict=True)]
    metrics = list(best["metric"])
    values = ", ".join(
        f"{n} {_num(best['values'][m])}" for n, m in zip(named, metrics, strict=True)
    )
    front = best.get("pareto_front") or []
    lines = [
        f"- **Best trial:** `{best['trial_id']}`, chosen from the Pareto front by the pick "
        f"`{json.dumps(best.get('pick'))}`",
        f"- **Its metrics:** {values}",
        "",
        f"**Pareto front** ({len(front)} trial{'s' if len(front) != 1 else ''}):",
        "",
        "| trial | " + " | ".join(named) + " |",
        "|---" * (len(metrics) + 1) + "|",
    ]
    for point in front:
        mark = " (chosen)" if point["trial_id"] == best["trial_id"] else ""
        cells = " | ".join(_num(point["values"].get(m)) for m in metrics)
        lines.append(f"| `{point['trial_id']}`{mark} | {cells} |")
    return lines


def approval_body(best: Mapping[str, Any], run_page_url: str) -> str:
    """The approval's Markdown body: the best trial, its metric (with several metrics, its values
    and the run's Pareto front), its config and checkpoint, the run's trial counts, and a link to
    the run's dashboard page. ``best`` is ``select_best``'s XCom."""
    lines = [
        f"Experiment **{best['experiment_name']}**, experiment run {best['experiment_run_id']}.",
        "",
        *(_several_metrics(best) if isinstance(best["metric"], list) else _one_metric(best)),
    ]
    if isinstance(best["metric"], list):
        lines.append("")
    lines += [
        f"- **Config:** `{json.dumps(best['config'], sort_keys=True)}`",
        f"- **Checkpoint:** `{best['best_checkpoint']}`"
        if best.get("best_checkpoint")
        else "- **Checkpoint:** none kept",
        f"- **Trials:** {best['finished_trials']} of {best['trials']} finished, "
        f"{best['failed_trials']} failed, {best['never_ran_trials']} never ran",
    ]
    if "feasible" in best:
        lines.append(
            f"- **Constraints:** {'met' if best['feasible'] else 'NOT met (no trial met them)'}"
        )
    lines += [
        "",
        f"[Open the run in the trials dashboard]({run_page_url})",
        "",
        "Approve to publish this trial as the experiment's best (an event on its Asset); reject "
        f"to publish nothing. Give a {REASON}: it is recorded with your name.",
    ]
    return "\n".join(lines)


class ApproveBestOperator(ApprovalOperator):
    """Airflow's ApprovalOperator, asked about ``select_best``'s best trial, answered by one of
    the approvers.

    Its body (:func:`approval_body`) is written when the task runs, from ``best``; the form has
    one field, ``reason``. The answer is recorded in the trials DB beside the run
    (``TrialStore.record_approval``) with what it counts as (``core/approval_rule.py``): "Reject"
    skips the tasks right after it (``publish_best``), as ApprovalOperator does; an approval by
    the user who triggered the run (unless ``allow_self_approval``) fails the task, and clearing
    it asks again. A DAG run whose best was rejected is not asked again: the task fails. The XCom
    ``decision`` (also the return value, when approved) holds ApprovalOperator's answer
    (``chosen_options``, ``params_input``, ``responded_by_user``, ``responded_at``) plus
    ``approved``, ``outcome``, ``reason``, ``trial_id`` and ``experiment_run_id``; the log says
    who decided and why.

    :param best: ``select_best``'s XCom (an XComArg, resolved when the task runs).
    :param experiment_name: the experiment, named in the subject.
    :param policy: who may approve (Airflow's ``assigned_users``), and whether the user who
        triggered the run may.
    :param trials_conn_id: the trials DB's connection; default ``trials_default``.
    """

    template_fields = (*ApprovalOperator.template_fields, "best")

    def __init__(
        self,
        *,
        best: Any,
        experiment_name: str,
        policy: ApprovalPolicy,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        params: Any = None,
        **kwargs: Any,
    ) -> None:
        # Airflow's apply_defaults hands this the DAG's params (an experiment DAG always has the
        # extend_* ones); the form has only its own field. ApprovalOperator's apply_defaults
        # merges the DAG's in again, and HITLOperator keeps the task's own.
        del params
        super().__init__(
            subject=f"Publish the best trial of experiment {experiment_name}?",
            params={
                REASON: Param(
                    "",
                    type="string",
                    title="Reason",
                    description="Why you approve or reject this trial; recorded with your name.",
                )
            },
            assigned_users=[{"id": a.id, "name": a.name} for a in policy.approvers],
            **kwargs,
        )
        self.best = best
        self.experiment_name = experiment_name
        self.policy = policy
        self.trials_conn_id = trials_conn_id

    def execute(self, context: Any) -> Any:
        run_pk, run_id = self.best["experiment_run_id"], context["ti"].run_id
        with open_store(self.trials_conn_id) as store:
            recorded = recorded_answer(store, run_pk, run_id, self.best["trial_id"])
        if recorded is not None and recorded.outcome.is_final():
            raise AirflowFailException(
                f"Experiment {self.experiment_name}, DAG run {run_id}: the best trial "
                f"{recorded.trial_id} of experiment run {run_pk} was rejected by "
                f"{recorded.responded_by_name} at {recorded.responded_at.isoformat()} (DAG run "
                f"{recorded.dag_run_id}); a "
                "rejection is final, so it is not asked again. Trigger a new DAG run."
            )
        run_page = dashboard_url(RUN_PAGE.format(run_pk=run_pk))
        self.body = approval_body(self.best, run_page)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        try:
            answer = super().execute_complete(context, event)
        except DownstreamTasksSkipped:  # "Reject": ApprovalOperator skips publish_best
            self._record(context, event, approved=False)
            raise
        decision, stands = self._record(context, answer, approved=True)
        if not stands.outcome.publishes():
            raise AirflowFailException(
                f"Experiment {self.experiment_name}, DAG run {context['ti'].run_id}: the best "
                f"trial {stands.trial_id} is not approved: {stands.describe()}."
            )
        return decision

    def _record(
        self, context: Any, answer: Mapping[str, Any], *, approved: bool
    ) -> tuple[dict[str, Any], RunApprovalRecord]:
        """Record the answer in the trials DB, log who decided and why, and keep it as the XCom
        ``decision`` (a rejection ends the task without a return value: ApprovalOperator skips
        by raising); the decision, and the record that stands (a rejection recorded before
        stays)."""
        reason = (answer["params_input"] or {}).get(REASON) or ""
        # None only when a timeout took a default answer: nobody, so no approver.
        who = answer["responded_by_user"] or {"id": "", "name": "nobody (timed out)"}
        triggered_by = getattr(context.get("dag_run"), "triggering_user_name", None)
        outcome = self.policy.judge(
            approved=approved,
            responder_id=str(who["id"]),
            responder_name=str(who["name"]),
            triggered_by=triggered_by,
        )
        with open_store(self.trials_conn_id) as store:
            stands = store.record_approval(
                self.best["experiment_run_id"],
                context["ti"].run_id,
                trial_id=self.best["trial_id"],
                outcome=outcome,
                responded_by_id=str(who["id"]),
                responded_by_name=str(who["name"]),
                responded_at=answer["responded_at"],
                reason=reason,
                triggered_by=triggered_by,
            )
        self.log.info(
            "Experiment %s, DAG run %s: %s (id %s) %s the best trial %s at %s; reason: %s. %s",
            self.experiment_name,
            context["ti"].run_id,
            who.get("name"),
            who.get("id"),
            "approved" if approved else "rejected",
            self.best["trial_id"],
            answer["responded_at"].isoformat(),
            reason or "(none given)",
            _consequence(stands),
        )
        decision = {
            "chosen_options": list(answer["chosen_options"]),
            "params_input": dict(answer["params_input"] or {}),
            "responded_by_user": answer["responded_by_user"],
            "responded_at": answer["responded_at"],
            "approved": approved,
            "outcome": stands.outcome.value,
            "triggered_by": triggered_by,
            REASON: reason,
            "trial_id": self.best["trial_id"],
            "experiment_run_id": self.best["experiment_run_id"],
        }
        context["ti"].xcom_push(key=DECISION_KEY, value=decision)
        return decision, stands


@contextmanager
def open_store(trials_conn_id: str) -> Iterator[TrialStore]:
    """The trials DB of ``trials_conn_id``, its connections closed on the way out."""
    store = TrialsDbHook(trials_conn_id).get_conn()
    try:
        yield store
    finally:
        store.dispose()


def recorded_answer(
    store: TrialStore, run_pk: int, run_id: str, trial_id: str
) -> RunApprovalRecord | None:
    """The answer that stands for DAG run ``run_id`` about trial ``trial_id`` of experiment run
    ``run_pk``: a rejection of that trial by any DAG run (final, as the store keeps it), else
    this DAG run's answer; None if none."""
    answers = store.reader.run_approvals(run_pk)
    rejected = (a for a in answers if a.trial_id == trial_id and a.outcome.is_final())
    return next(rejected, None) or next((a for a in answers if a.dag_run_id == run_id), None)


def _consequence(recorded: RunApprovalRecord) -> str:
    if recorded.outcome.publishes():
        return "publish_best emits the Asset event."
    if recorded.outcome.is_final():
        return "publish_best is skipped: the Asset gets no event, and the rejection is final."
    return f"publish_best publishes nothing: {recorded.describe()}."


def _instant(value: Any) -> dt.datetime:
    """An XCom's ``responded_at`` (a datetime, or its ISO text) as an aware UTC datetime."""
    value = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def check_publishable(
    plan: TuningPlan,
    policy: ApprovalPolicy,
    best: Mapping[str, Any],
    answer: Mapping[str, Any] | None,
    context: Any,
) -> RunApprovalRecord:
    """The recorded approval that lets ``publish_best`` publish ``best`` in this DAG run;
    AirflowFailException, saying why, when there is none: no answer recorded (``approve_best``
    marked success, or never answered), a rejection, an approval that does not count (the
    approver triggered the run, or is no approver), or an ``answer`` (``approve_best``'s XCom
    ``decision`` in this try) that is missing or is not the recorded one."""
    run_pk, run_id = best["experiment_run_id"], context["ti"].run_id
    where = f"Experiment {plan.experiment_name}, DAG run {run_id}: publish_best refuses"
    with open_store(plan.trials_conn_id) as store:
        recorded = recorded_answer(store, run_pk, run_id, best["trial_id"])
    if recorded is None:
        raise AirflowFailException(
            f"{where}: no answer to approve_best is recorded for experiment run {run_pk} (was "
            "approve_best marked success?). Clear approve_best so that an approver answers."
        )
    triggered_by = getattr(context.get("dag_run"), "triggering_user_name", None)
    outcome = recorded.outcome
    if outcome.publishes():  # judged again: the approvers and the run's trigger as they are now
        outcome = policy.judge(
            approved=True,
            responder_id=recorded.responded_by_id,
            responder_name=recorded.responded_by_name,
            triggered_by=triggered_by,
        )
    if not outcome.publishes():
        who = f"{recorded.responded_by_name} (id {recorded.responded_by_id})"
        raise AirflowFailException(f"{where}: {refusal(outcome, who, triggered_by)}.")
    mismatch = (
        answer is None
        or recorded.trial_id != best["trial_id"]
        or str((answer.get("responded_by_user") or {}).get("id")) != recorded.responded_by_id
        or _instant(answer["responded_at"]) != recorded.responded_at
    )
    if mismatch:
        raise AirflowFailException(
            f"{where}: the approval recorded for trial {recorded.trial_id} is not approve_best's "
            "answer in this try (was approve_best marked success after a clear?). Clear "
            "approve_best so that an approver answers."
        )
    return recorded


def approve_and_publish(plan: TuningPlan, policy: ApprovalPolicy, best: Any) -> Any:
    """Declare ``approve_best >> publish_best`` after ``best`` (``select_best``'s XComArg), in the
    current task group, under ``policy`` (``plan.approval``); returns ``publish_best``'s
    XComArg."""
    approve = ApproveBestOperator(
        task_id=APPROVE_TASK_ID,
        best=best,
        experiment_name=plan.experiment_name,
        policy=policy,
        trials_conn_id=plan.trials_conn_id,
    )

    @task(task_id=PUBLISH_TASK_ID, outlets=[plan.asset])
    def publish_best(best: dict[str, Any], **context: Any) -> dict[str, Any]:
        """Emit the best trial as an event on the experiment's Asset, once an approver other
        than the run's trigger has approved it (the trials DB's record, :func:`check_publishable`).
        """
        answer = context["ti"].xcom_pull(task_ids=approve.task_id, key=DECISION_KEY)
        check_publishable(plan, policy, best, answer, context)
        context["outlet_events"][plan.asset].extra = best
        return best

    published = publish_best(best)
    approve >> published
    return published
