"""The approval gate's rule: who may approve a run's best trial, what an answer counts as, and
whether it lets ``publish_best`` publish. One owner: the approval task records the outcome this
judges, and ``publish_best`` asks it again before it publishes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple


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


class Approver(NamedTuple):
    """A user who may answer: the auth manager's id (what Airflow's ``assigned_users`` matches)
    and the name the Required Actions page shows."""

    id: str
    name: str


@dataclass(frozen=True)
class ApprovalPolicy:
    """Who may approve, and whether the user who triggered a run may approve it.

    :param approvers: the users who may answer; never empty.
    :param allow_self_approval: let the user who triggered the run approve it (one-person
        teams); default False: four eyes.
    """

    approvers: tuple[Approver, ...]
    allow_self_approval: bool = False

    @classmethod
    def of(cls, approvers: Any, allow_self_approval: Any = False) -> ApprovalPolicy:
        """The policy of ``tuning_experiment(approvers=..., allow_self_approval=...)``; each
        approver is a user id (``"alice"``, its name the same) or ``{"id": "3", "name":
        "alice"}``. ValueError, saying what to pass, for anything else."""
        approvers = [] if approvers is None else approvers
        if isinstance(approvers, (str, Mapping)) or not isinstance(approvers, (list, tuple)):
            raise ValueError(
                f"approvers={approvers!r} is not a list of user ids; pass the Airflow user ids "
                'who may approve, e.g. approvers=["alice", "bob"]'
            )
        if not approvers:
            raise ValueError(
                "approval=True needs approvers, the Airflow user ids who may approve the best "
                'trial, e.g. approvers=["alice", "bob"]; nobody else may answer'
            )
        if not isinstance(allow_self_approval, bool):
            raise ValueError(
                f"allow_self_approval={allow_self_approval!r} is not True or False; leave it "
                "out (four eyes), or pass True to let the user who triggered a run approve it"
            )
        return cls(tuple(_approver(one) for one in approvers), allow_self_approval)

    @property
    def approver_ids(self) -> frozenset[str]:
        return frozenset(a.id for a in self.approvers)

    def judge(
        self, *, approved: bool, responder_id: str, responder_name: str, triggered_by: str | None
    ) -> ApprovalOutcome:
        """What an answer counts as. ``triggered_by`` is the DAG run's triggering user name
        (None for a scheduled or asset-triggered run, which no user triggered); Airflow names a
        user by ``get_name()`` there, so both the responder's id and name are compared."""
        if not approved:
            return ApprovalOutcome.REJECTED
        if responder_id not in self.approver_ids:
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


def _approver(value: Any) -> Approver:
    if isinstance(value, str) and value:
        return Approver(value, value)
    if isinstance(value, Mapping) and set(value) == {"id", "name"}:
        user_id, name = value["id"], value["name"]
        if isinstance(user_id, str) and user_id and isinstance(name, str) and name:
            return Approver(user_id, name)
    raise ValueError(
        f"approver {value!r} is not a user id; give each approver as its Airflow user id (a "
        'non-empty string such as "alice") or as {"id": "3", "name": "alice"}'
    )
