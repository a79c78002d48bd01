"""The approval gate's rule (``core/approval_rule.py``): what an answer to approve_best counts
as."""

from __future__ import annotations

import pytest

from airflow_trials.core.approval_rule import ApprovalOutcome, ApprovalPolicy

POLICY = ApprovalPolicy.of(["bob", {"id": "7", "name": "carol"}])


@pytest.mark.parametrize(
    ("approved", "responder", "triggered_by", "outcome"),
    [
        (True, ("bob", "bob"), "alice", ApprovalOutcome.APPROVED),
        (True, ("7", "carol"), None, ApprovalOutcome.APPROVED),  # a scheduled run: no trigger
        (False, ("bob", "bob"), "bob", ApprovalOutcome.REJECTED),  # anyone may say no
        (True, ("bob", "bob"), "bob", ApprovalOutcome.SELF_APPROVED),
        (True, ("7", "carol"), "carol", ApprovalOutcome.SELF_APPROVED),  # by name too
        # An auth manager that lets every admin answer (simple_auth_manager_all_admins).
        (True, ("admin", "admin"), "alice", ApprovalOutcome.NOT_AN_APPROVER),
    ],
)
def test_an_answer_counts_only_from_an_approver_who_did_not_trigger_the_run(
    approved, responder, triggered_by, outcome
):
    got = POLICY.judge(
        approved=approved,
        responder_id=responder[0],
        responder_name=responder[1],
        triggered_by=triggered_by,
    )
    assert got is outcome
    assert got.publishes() is (outcome is ApprovalOutcome.APPROVED)
    assert got.is_final() is (outcome is ApprovalOutcome.REJECTED)


def test_allow_self_approval_lets_the_run_s_trigger_approve_but_not_a_stranger():
    solo = ApprovalPolicy.of(["bob"], allow_self_approval=True)
    judge = dict(approved=True, responder_id="bob", responder_name="bob", triggered_by="bob")
    assert solo.judge(**judge) is ApprovalOutcome.APPROVED
    stranger = {**judge, "responder_id": "eve", "responder_name": "eve"}
    assert solo.judge(**stranger) is ApprovalOutcome.NOT_AN_APPROVER
