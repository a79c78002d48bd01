"""A run's scheduler decisions on the dashboard: the rungs ASHA, HyperBand and MOASHA judged its
trials at (cutoffs, stopped trials) and PBT's lineage graph, as a page and as JSON, behind the
run's per-DAG access."""

from __future__ import annotations

import math
import re

import pytest

from airflow_trials.plugins.services.decisions import (
    LINEAGE_TRIALS_SHOWN,
    involvement,
    lineage_view,
    recorded_cutoff,
)
from airflow_trials.schedulers.asha.rung_math import (
    RungStop,
    ValueList,
    asha_rung_decision,
    rung_stop_reason,
)
from tests.plugins.conftest import HOSTILE
from tests.plugins.decisions_seed import asha_run, moasha_run, pbt_run


def _decisions(dashboard, run: int, user: str = "admin"):
    response = dashboard.get(f"/api/runs/{run}/decisions", user=user)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize(("mode", "value", "cutoff"), [("min", 0.7431, 0.5123), ("max", 2.0, 3.25)])
def test_the_cutoff_is_read_back_from_the_reason_asha_writes(mode, value, cutoff):
    reason = rung_stop_reason(
        RungStop(2, 4, 3.0, cutoff, bracket=1, brackets=3),
        time_attr="training_iteration",
        time=3,
        metric="loss",
        mode=mode,
        value=value,
    )
    assert recorded_cutoff(reason) == cutoff
    assert recorded_cutoff(None) is None
    assert recorded_cutoff("stopped by ASHA at training_iteration=27: it reached max_t=27") is None


def test_a_real_asha_run_s_rungs_their_counts_cutoffs_and_stopped_trials(dashboard, trials_store):
    seeded = asha_run(trials_store, "asha", 40)
    body = _decisions(dashboard, seeded.run)
    assert (body["run_id"], body["metric"], body["vector"], body["exploits"]) == (
        seeded.run,
        "loss",
        False,
        [],
    )
    # Every rung, counted from the trial-level reads (one trial at a time) the trial page uses.
    per_trial = {t: trials_store.reader.trial_rungs(t) for t in seeded.trials}
    milestones = sorted({r.milestone for rungs in per_trial.values() for r in rungs})
    assert [r["milestone"] for r in body["rungs"]] == milestones == [1.0, 3.0, 9.0, 27.0]
    for rung in body["rungs"]:
        at = [r for rungs in per_trial.values() for r in rungs if r.milestone == rung["milestone"]]
        stops = {r.trial_id for r in at if r.decision.value == "STOP" and not r.at_end}
        assert rung["reached"] == len(at) == len(rung["trials"])
        assert rung["stopped"] == len(stops)
        assert {t["trial_id"] for t in rung["trials"] if t["verdict"] == "STOP"} == stops
        assert rung["continued"] + rung["stopped"] + rung["recorded_at_end"] == rung["reached"]
    first = body["rungs"][0]
    assert first["reached"] == 40 and first["stopped"] > 0
    # The cutoff is the one ASHA computed at the rung's latest stop, from the values before it.
    for rung in body["rungs"][:3]:
        if not rung["stopped"]:
            continue
        trials = rung["trials"]
        last = max(i for i, t in enumerate(trials) if t["verdict"] == "STOP")
        before = [t["value"] if t["value"] is not None else math.nan for t in trials[:last]]
        expected = asha_rung_decision(ValueList(before), trials[last]["value"], 3, "min").cutoff
        assert rung["cutoff"] == pytest.approx(expected, rel=1e-3)
        assert rung["cutoff_min"] <= rung["cutoff"] <= rung["cutoff_max"]
        for t in trials:  # every stopped trial was worse than the cutoff it was judged by
            if t["verdict"] == "STOP":
                assert t["value"] > recorded_cutoff(t["reason"])
    # The trials the rungs stopped are those the run's stop reasons name.
    stopped_at_rungs = {
        t["trial_id"] for rung in body["rungs"] for t in rung["trials"] if t["verdict"] == "STOP"
    }
    assert stopped_at_rungs == {t for t, why in seeded.stopped.items() if "cutoff" in why}


def test_the_decisions_page_draws_each_rung_and_the_run_page_links_it(dashboard, trials_store):
    seeded = asha_run(trials_store, "asha", 30)
    body = _decisions(dashboard, seeded.run)
    page = dashboard.get(f"/runs/{seeded.run}/decisions")
    assert page.status_code == 200
    html = page.text
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="curves rungs-chart"') == 1
    points = sum(1 for rung in body["rungs"] for t in rung["trials"] if t["value"] is not None)
    assert html.count('class="rung-point ') == points
    stopped = sum(rung["stopped"] for rung in body["rungs"])
    assert html.count('class="rung-point stopped"') == stopped
    assert html.count('<line class="cutoff"') == sum(r["cutoff"] is not None for r in body["rungs"])
    rows = re.findall(r'<tr data-milestone="([^"]+)">', html)
    assert rows == ["1", "3", "9", "27"]
    assert "<script" not in html.split("</head>")[1]  # the chart needs no script
    assert 'class="run-lineage"' not in html  # ASHA only: no lineage section
    run_page = dashboard.get(f"/runs/{seeded.run}").text
    assert f'href="/trials/runs/{seeded.run}/decisions"' in run_page
    assert f"{sum(r['reached'] for r in body['rungs'])} rung verdicts, {stopped} of them" in (
        run_page
    )


def test_hyperband_s_brackets_get_a_table_and_a_chart_each(dashboard, trials_store):
    seeded = asha_run(trials_store, "hyperband", 45, brackets=3)
    body = _decisions(dashboard, seeded.run)
    brackets = sorted({r["bracket"] for r in body["rungs"]})
    assert brackets == [0, 1, 2]
    # Bracket b starts at milestone 3**b: its rungs are those of the brackets before, less one.
    firsts = {b: min(r["milestone"] for r in body["rungs"] if r["bracket"] == b) for b in brackets}
    assert firsts == {0: 1.0, 1: 3.0, 2: 9.0}
    html = dashboard.get(f"/runs/{seeded.run}/decisions").text
    assert [f"Bracket {b + 1} of 3" for b in brackets] == re.findall(r"Bracket \d of 3", html)
    assert html.count('class="curves rungs-chart"') == 3
    assert html.count('<table class="run-rungs"') == 3


def test_moasha_s_vector_rungs_show_the_first_metric_and_no_cutoff(dashboard, trials_store):
    seeded = moasha_run(trials_store, "moasha", 24)
    body = _decisions(dashboard, seeded.run)
    assert (body["metric"], body["vector"]) == ("loss", True)
    records = [t for rung in body["rungs"] for t in rung["trials"]]
    assert all(len(t["values"]) == 2 for t in records)
    assert all(t["value"] == t["values"][0] for t in records)
    assert any(t["value"] is None for t in records)  # a NaN loss is null, not NaN
    assert all(r["cutoff"] is None for r in body["rungs"])
    at_rungs = {t for t, why in seeded.stopped.items() if "rank score" in why}  # not at max_t
    assert sum(r["stopped"] for r in body["rungs"]) == len(at_rungs) > 0
    html = dashboard.get(f"/runs/{seeded.run}/decisions").text
    assert "MOASHA judged vectors of metrics (loss, latency)" in html
    assert "cutoff (latest)" not in html and '<line class="cutoff"' not in html


def test_a_pbt_run_s_lineage_graph_has_an_arrow_per_exploit(dashboard, trials_store):
    seeded = pbt_run(trials_store, "pbt", 24)
    body = _decisions(dashboard, seeded.run)
    assert body["rungs"] == []
    assert [(e["trial_id"], e["donor_trial_id"], e["iteration"]) for e in body["exploits"]] == (
        seeded.exploits
    )
    first = body["exploits"][0]
    assert first["donor_url"] == f"/trials/trials/{first['donor_trial_id']}"
    assert [c["key"] for c in first["changes"]] and first["changes"][0]["operation"].endswith(
        ("* 0.8", "* 1.2")
    )
    html = dashboard.get(f"/runs/{seeded.run}/decisions").text
    arrows = re.findall(
        r'<g class="exploit" data-trial="([^"]+)" data-donor="([^"]+)" data-iteration="(\d+)">'
        r"<title>([^<]*)</title>",
        html,
    )
    assert [(t, d, int(i)) for t, d, i, _ in arrows] == seeded.exploits
    trial, donor, iteration, tip = arrows[0]
    assert tip.startswith(f"{trial} copied {donor}&#x27;s checkpoint at iteration {iteration} (")
    assert "lr " in tip and " → " in tip
    involved = {t for e in seeded.exploits for t in e[:2]}
    assert html.count('class="trial-label"') == len(involved)  # rows: the trials in exploits only
    assert "trials in the most exploits are shown" not in html
    assert 'class="run-rungs"' not in html
    assert f"{len(seeded.exploits)} PBT exploits" in dashboard.get(f"/runs/{seeded.run}").text


def test_a_large_population_s_graph_keeps_the_trials_in_the_most_exploits(dashboard, trials_store):
    seeded = pbt_run(trials_store, "pbt", 400, generations=3, bulk=True)
    exploits = trials_store.reader.run_exploits(seeded.run)
    counts = involvement(exploits)
    assert len(counts) > LINEAGE_TRIALS_SHOWN
    view = lineage_view(exploits, links=_Links())
    assert len(view.shown_trials) == LINEAGE_TRIALS_SHOWN and view.capped
    cut = sorted(counts.values(), reverse=True)[LINEAGE_TRIALS_SHOWN - 1]
    assert all(counts[t] >= cut for t in view.shown_trials)
    assert all(counts[t] <= cut for t in counts if t not in view.shown_trials)
    html = dashboard.get(f"/runs/{seeded.run}/decisions").text
    assert (
        f"The {LINEAGE_TRIALS_SHOWN} trials in the most exploits are shown, of {len(counts)}"
        in (html)
    )
    assert html.count('class="trial-label"') == LINEAGE_TRIALS_SHOWN
    assert html.count('<g class="exploit"') == view.shown_exploits < len(exploits)
    assert html.count("<tr data-trial=") == 50  # the newest 50 exploits listed; JSON has all
    assert len(_decisions(dashboard, seeded.run)["exploits"]) == len(exploits)


class _Links:
    base = "/trials"

    def trial(self, trial_id: str) -> str:
        return f"/trials/trials/{trial_id}"


def test_a_run_without_decisions_shows_no_section(dashboard):
    run = dashboard.seeded.run
    assert "run-decisions" not in dashboard.get(f"/runs/{run}").text
    body = _decisions(dashboard, run)
    assert (body["rungs"], body["exploits"], body["vector"]) == ([], [], False)
    page = dashboard.get(f"/runs/{run}/decisions").text
    assert 'class="muted no-decisions"' in page and "<svg" not in page


def test_a_user_without_access_to_the_run_s_dag_gets_nothing(dashboard, trials_store):
    seeded = asha_run(trials_store, "asha", 6)
    for path in (f"/runs/{seeded.run}/decisions", f"/api/runs/{seeded.run}/decisions"):
        response = dashboard.get(path, user="bob")
        assert response.status_code == 403
        assert "User bob may not read" in response.text and "asha-0000" not in response.text
        assert dashboard.get(path, user="alice").status_code == 200
        assert dashboard.get(path, user=None).status_code == 401
    assert dashboard.get("/api/runs/999999/decisions").status_code == 404
    assert dashboard.get("/runs/999999/decisions").status_code == 404


def test_configs_in_the_lineage_are_escaped(dashboard, trials_store):
    seeded = pbt_run(trials_store, "pbt", 8, generations=1)
    trial, donor, _ = seeded.exploits[0]
    trials_store.record_exploit(
        trial,
        iteration=9,
        donor_trial_id=donor,
        donor_checkpoint="/ckpt/x",
        old_config=trials_store.reader.get_trial(trial).config,
        new_config={"lr": 0.5, HOSTILE: HOSTILE},
        operations={HOSTILE: HOSTILE},
    )
    html = dashboard.get(f"/runs/{seeded.run}/decisions").text
    assert HOSTILE not in html and "&lt;script&gt;" in html


def test_the_openapi_schema_lists_the_endpoint(dashboard):
    schema = dashboard.client.get("/trials/openapi.json").json()
    assert "/api/runs/{run_pk}/decisions" in schema["paths"]
    assert {"RunDecisionsOut", "RunRungOut", "RunExploitOut"} <= set(
        schema["components"]["schemas"]
    )
