"""``tuning_experiment(approval=True)``: Airflow's ApprovalOperator between ``select_best`` and
``publish_best``, the task that emits the best trial's Asset event.

On Airflow 3.3 the approval task waits in the ``awaiting_input`` state (no trigger, no triggerer)
until someone answers in the UI's Required Actions page or through the REST API
(``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails``). An
answer "Reject" makes ApprovalOperator skip ``publish_best``, so the Asset gets no event and the
tasks after the group are skipped. Who answered, when, and the reason they gave are kept by
Airflow (the task instance's HITL detail) and in the approval task's XCom and log; the trials DB
has no column for them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, task
from airflow.sdk.exceptions import DownstreamTasksSkipped

from airflow_trials.operators.links import RUN_PAGE, dashboard_url

if TYPE_CHECKING:
    from airflow_trials.experiment.plan import TuningPlan

APPROVE_TASK_ID = "approve_best"
PUBLISH_TASK_ID = "publish_best"
REASON = "reason"
DECISION_KEY = "decision"


def checked_approval(experiment_name: str, approval: object) -> bool:
    """``approval`` as given, if it is a bool; ValueError otherwise (a string such as ``"no"``
    would be taken as true)."""
    if not isinstance(approval, bool):
        raise ValueError(
            f"Experiment {experiment_name}: approval={approval!r} is not True or False; pass "
            "approval=True to have a person approve the best trial before it is published, or "
            "leave it out."
        )
    return approval


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
    """Airflow's ApprovalOperator, asked about ``select_best``'s best trial.

    Its body (:func:`approval_body`) is written when the task runs, from ``best``; the form has
    one field, ``reason``. "Reject" skips the tasks right after it (``publish_best``), as
    ApprovalOperator does. The XCom ``decision`` (also the return value, when approved) holds
    ApprovalOperator's answer (``chosen_options``, ``params_input``, ``responded_by_user``,
    ``responded_at``) plus ``approved``, ``reason``, ``trial_id`` and ``experiment_run_id``; the
    log says who decided and why.

    :param best: ``select_best``'s XCom (an XComArg, resolved when the task runs).
    :param experiment_name: the experiment, named in the subject.
    """

    template_fields = (*ApprovalOperator.template_fields, "best")

    def __init__(
        self, *, best: Any, experiment_name: str, params: Any = None, **kwargs: Any
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
            **kwargs,
        )
        self.best = best
        self.experiment_name = experiment_name

    def execute(self, context: Any) -> Any:
        run_page = dashboard_url(RUN_PAGE.format(run_pk=self.best["experiment_run_id"]))
        self.body = approval_body(self.best, run_page)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        try:
            answer = super().execute_complete(context, event)
        except DownstreamTasksSkipped:  # "Reject": ApprovalOperator skips publish_best
            self._record(context, event, approved=False)
            raise
        return self._record(context, answer, approved=True)

    def _record(self, context: Any, answer: Mapping[str, Any], *, approved: bool) -> dict[str, Any]:
        """Log who decided and why, and keep it as the XCom ``decision``: a rejection ends the
        task without a return value (ApprovalOperator skips by raising)."""
        reason = (answer["params_input"] or {}).get(REASON) or ""
        who = answer["responded_by_user"] or {}
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
            "publish_best emits the Asset event."
            if approved
            else "publish_best is skipped: the Asset gets no event.",
        )
        decision = {
            "chosen_options": list(answer["chosen_options"]),
            "params_input": dict(answer["params_input"] or {}),
            "responded_by_user": answer["responded_by_user"],
            "responded_at": answer["responded_at"],
            "approved": approved,
            REASON: reason,
            "trial_id": self.best["trial_id"],
            "experiment_run_id": self.best["experiment_run_id"],
        }
        context["ti"].xcom_push(key=DECISION_KEY, value=decision)
        return decision


def approve_and_publish(plan: TuningPlan, best: Any) -> Any:
    """Declare ``approve_best >> publish_best`` after ``best`` (``select_best``'s XComArg), in the
    current task group; returns ``publish_best``'s XComArg."""
    approve = ApproveBestOperator(
        task_id=APPROVE_TASK_ID, best=best, experiment_name=plan.experiment_name
    )

    @task(task_id=PUBLISH_TASK_ID, outlets=[plan.asset])
    def publish_best(best: dict[str, Any], **context: Any) -> dict[str, Any]:
        """Emit the approved best trial as an event on the experiment's Asset."""
        context["outlet_events"][plan.asset].extra = best
        return best

    published = publish_best(best)
    approve >> published
    return published
