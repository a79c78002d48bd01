"""The approval gate's rule: who may approve a run's best trial, what an answer counts as, and
whether it lets ``publish_best`` publish. One owner: the approval task records the outcome this
judges, and ``publish_best`` asks it again before it publishes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ApprovalOutcome(StrEnum):
    """What an answer to ``approve_best`` counts as, as the trials DB records it."""

    #: Approved by an approver who did not trigger the run: ``publish_best`` publishes.
    APPROVED = "APPROVED"
    #: Rejected: final, no later answer replaces it and nothing of the run is published.
    REJECTED = "REJECTED"
    #: Approved by the user who triggered the run: four eyes refuse it (unless
    #: ``allow_self_approval``); another approver may answer once the task is cleared.
    SELF_APPROVED = "SELF_APPROVED"
    #: Approved by a user who is not among the approvers: refused.
    NOT_AN_APPROVER = "NOT_AN_APPROVER"

    def publishes(self) -> bool:
        return self is ApprovalOutcome.APPROVED

    def is_final(self) -> bool:
        """A rejection stands: a later answer (the task cleared and asked again) never replaces
        it."""
        return self is ApprovalOutcome.REJECTED


@dataclass(frozen=True)
class ApprovalPolicy:
    """Who may approve, and whether the user who triggered a run may approve it.

    :param approvers: the user ids that may answer (the auth manager's ids, as Airflow's
        ``assigned_users`` holds them); never empty.
    :param allow_self_approval: let the user who triggered the run approve it (one-person
        teams); default False: four eyes.
    """

    approvers: tuple[str, ...]
    allow_self_approval: bool = False

    def judge(
        self, *, approved: bool, responder_id: str, responder_name: str, triggered_by: str | None
    ) -> ApprovalOutcome:
        """What an answer counts as. ``triggered_by`` is the DAG run's triggering user name
        (None for a scheduled or asset-triggered run, which no user triggered); Airflow names a
        user by ``get_name()`` there, so both the responder's id and name are compared."""
        if not approved:
            return ApprovalOutcome.REJECTED
        if responder_id not in self.approvers:
            return ApprovalOutcome.NOT_AN_APPROVER
        if (
            not self.allow_self_approval
            and triggered_by is not None
            and triggered_by in (responder_id, responder_name)
        ):
            return ApprovalOutcome.SELF_APPROVED
        return ApprovalOutcome.APPROVED


def refusal(outcome: ApprovalOutcome, who: str, triggered_by: str | None) -> str:
    """Why ``outcome`` publishes nothing, in words (the tasks' errors, the CLI, the dashboard)."""
    if outcome is ApprovalOutcome.REJECTED:
        return f"{who} rejected it, and a rejection is final"
    if outcome is ApprovalOutcome.SELF_APPROVED:
        return (
            f"{who} approved it but also triggered the run ({triggered_by}); four eyes: another "
            "approver must approve (clear approve_best to ask again)"
        )
    if outcome is ApprovalOutcome.NOT_AN_APPROVER:
        return f"{who} approved it but is not among the approvers"
    return ""
