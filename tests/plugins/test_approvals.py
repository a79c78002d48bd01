"""The run page shows the answers to the run's approve_best (``tuning_experiment(approval=True)``)
as the trials DB recorded them: who, when, why, who triggered the DAG run, and the outcome; a run
without one shows no section. (tests/airflow/test_approval.py shows one recorded by a real
approval on the api-server's page.)"""

from __future__ import annotations

import datetime as dt


def test_the_run_page_shows_who_decided_when_and_why(make_dashboard, trials_store, seeded):
    for dag_run_id, outcome, who, reason in (
        ("manual__1", "SELF_APPROVED", "alice", ""),
        ("manual__extend-1", "REJECTED", "bob", "<b>val set</b> leaked"),
    ):
        trials_store.record_approval(
            seeded.run,
            dag_run_id,
            trial_id=seeded.trials[0],
            outcome=outcome,
            responded_by_id=who,
            responded_by_name=who.title(),
            responded_at=dt.datetime(2026, 11, 28, 9, 30, 5, tzinfo=dt.UTC),
            reason=reason,
            triggered_by="alice",
        )
    dashboard = make_dashboard(trials_store, seeded)
    page = dashboard.get(f"/runs/{seeded.run}").text
    section = page.split("<h2>Approval</h2>")[1].split("</table>")[0]
    assert section.count("<tr data-approval=") == 2
    assert "2026-11-28 09:30:05" in section and seeded.trials[0] in section
    assert (
        "Alice (id alice) approved it but also triggered the run (alice); four eyes: another "
        "approver must approve (clear approve_best to ask again); reason: (none given)"
    ) in section
    assert (
        "Bob (id bob) rejected it, and a rejection is final; reason: &lt;b&gt;val set&lt;/b&gt; "
        "leaked"
    ) in section
    assert "status-failed" in section and "status-success" not in section
    assert "<h2>Approval</h2>" not in dashboard.get(f"/runs/{seeded.other_run}").text
