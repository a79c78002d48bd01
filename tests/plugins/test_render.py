"""How the pages show values: result timestamps as UTC date-times, durations and numbers that never
wrap, the theme script that follows the Airflow UI's color mode, and a chart legible in both
modes."""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from markupsafe import escape

from airflow_trials.core.stop_kind import StopKind
from airflow_trials.plugins.charts.curves import learning_curves_svg
from airflow_trials.plugins.web.render import (
    THEME_SCRIPT,
    THEME_SCRIPT_HASH,
    is_number,
    result_value,
    utc,
)
from tests.factories import add_results, update_trial
from tests.plugins.conftest import FIRST_RESULT_AT, HOSTILE
from tests.plugins.test_api import ASHA_STOP, _record_decisions


@pytest.mark.parametrize(
    ("value", "key", "shown"),
    [
        (1795230765.0, "timestamp", "2026-11-21 03:12:45"),
        (1795230765.999, "timestamp", "2026-11-21 03:12:45"),  # to the second, never rounded up
        (0, "timestamp", "1970-01-01 00:00:00"),
        (-5.0, "timestamp", "-5"),  # not a date: shown as the number it is
        (1e300, "timestamp", "1e+300"),
        ("soon", "timestamp", "soon"),
        (True, "timestamp", "True"),
        (None, "timestamp", ""),
        (30.25, "time_this_iter_s", "30.250"),
        (0.0004, "time_total_s", "0.000"),
        (86400.5, "time_since_restore", "86400.500"),
        (1234567.0, "loss", "1.235e+06"),  # not a time: as any metric
        (4242, "pid", "4242"),
        ({"a": 1}, "extra", '{"a": 1}'),
    ],
)
def test_result_fields_are_shown_by_what_they_hold(value, key, shown):
    assert result_value(value, key) == shown


def test_utc_shows_aware_and_naive_datetimes_and_epoch_seconds_in_utc():
    moment = datetime(2026, 11, 21, 3, 12, 45, tzinfo=UTC)
    assert (
        utc(moment)
        == utc(moment.astimezone(timezone(timedelta(hours=-7))))
        == "2026-11-21 03:12:45"
    )
    assert (
        utc(moment.replace(tzinfo=None)) == "2026-11-21 03:12:45"
    )  # the store's naive values are UTC
    assert utc(moment.timestamp()) == "2026-11-21 03:12:45"


@pytest.mark.parametrize(
    ("value", "numeric"), [(1, True), (0.5, True), (True, False), ("1", False), (None, False)]
)
def test_booleans_are_not_numbers(value, numeric):
    assert is_number(value) is numeric


def test_a_trial_page_shows_timestamps_as_utc_dates_and_durations_as_seconds(dashboard):
    page = dashboard.get(f"/trials/{dashboard.seeded.failed_trial}").text
    first = datetime.fromtimestamp(FIRST_RESULT_AT + 30.25, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert first == "2026-11-21 03:13:15"
    assert f'<td class="num date" data-key="timestamp">{first}</td>' in page
    assert '<td class="num" data-key="time_this_iter_s">30.250</td>' in page
    assert '<td class="num" data-key="time_total_s">302.500</td>' in page
    assert "e+09" not in page
    headings = re.findall(r'<th class="num">([^<]*)</th>', page.split('<table class="results">')[1])
    # The trainable's metrics first, then the engine's fields; training_iteration is the first
    # column.
    assert headings == [
        "iteration",
        "acc",
        "loss",
        "pid",
        "time_this_iter_s",
        "time_total_s",
        "timestamp (UTC)",
    ]


def test_a_result_value_that_is_not_a_date_is_shown_escaped(dashboard, trials_store):
    add_results(
        trials_store,
        "mnist-11",
        [
            {"training_iteration": 1, "timestamp": 1795230765.0},
            {"training_iteration": 2, "loss": 0.4},
        ],
    )
    # A trainable may report a field of the engine's name holding anything: the store keeps it.
    add_results(trials_store, "mnist-11", [{"training_iteration": 3, "timestamp": HOSTILE}])
    page = dashboard.get("/trials/mnist-11").text
    assert '<td class="num date" data-key="timestamp">2026-11-21 03:12:45</td>' in page
    assert f'<td class="num date" data-key="timestamp">{escape(HOSTILE)}</td>' in page
    assert page.count("<script") == 1  # the theme script only


def test_numeric_config_values_are_numeric_cells_and_strings_are_not(dashboard):
    page = dashboard.get(f"/runs/{dashboard.seeded.run}").text
    assert '<th class="config num">lr</th>' in page and '<th class="config num">layers</th>' in page
    assert '<td class="config num">0.03333</td>' in page
    hostile = dashboard.get(f"/runs/{dashboard.seeded.hostile_run}").text
    assert '<th class="config">note</th>' in hostile
    assert f'<td class="config">{escape(HOSTILE)}</td>' in hostile


def test_an_early_stopped_trial_is_marked_with_its_reason_escaped(dashboard, trials_store):
    reason = (
        f"stopped by ASHA at training_iteration=3 (rung 1 of 4): {HOSTILE} 0.41 above the "
        "rung's cutoff 0.35"
    )
    update_trial(trials_store, "mnist-01", stop_reason=reason, stop_kind=StopKind.SCHEDULER)
    update_trial(
        trials_store,
        "mnist-02",
        stop_reason="it met its stopping criterion",
        stop_kind=StopKind.CRITERION,
    )
    board = dashboard.get(f"/runs/{dashboard.seeded.run}").text
    rows = dict(
        re.findall(r'<tr class="trial-row[^"]*" data-trial="([^"]+)">(.*?)</tr>', board, flags=re.S)
    )
    marker = f'<span class="early-stopped" title="{escape(reason)}">early-stopped</span>'
    assert marker in rows["mnist-01"]
    assert (
        "early-stopped" not in rows["mnist-02"]
        and 'title="it met its stopping criterion"' in rows["mnist-02"]
    )
    assert "early-stopped" not in rows["mnist-00"] and "title=" not in rows["mnist-00"]
    trial = dashboard.get("/trials/mnist-01").text
    # The kind, then the sentence.
    shown = (
        f'<td class="stop-reason"><span class="stop-kind">scheduler</span> {escape(reason)}</td>'
    )
    assert marker in trial and shown in trial
    assert "stop reason" not in dashboard.get("/trials/mnist-00").text
    assert board.count("<script") == trial.count("<script") == 1  # the theme script only


def test_the_run_page_filters_early_stopped_trials_and_its_links_keep_the_filter(
    dashboard, trials_store
):
    for trial_id in ("mnist-01", "mnist-04"):
        update_trial(
            trials_store,
            trial_id,
            stop_reason=f"stopped by ASHA at training_iteration=3: {HOSTILE}",
            stop_kind=StopKind.SCHEDULER,
        )
    run = dashboard.seeded.run
    page = dashboard.get(f"/runs/{run}", params={"stopped": "early", "page_size": 1}).text
    rows = re.findall(
        r'<tr class="trial-row[^"]*" data-trial="([^"]+)">\s*<td class="num">(\d+)</td>', page
    )
    assert rows == [("mnist-01", "2")]  # its rank among all the run's trials
    assert "<span>12 trials</span>" in page and "2 of 12 trials" in page
    assert (
        f'<a href="/trials/runs/{run}?sort=metric&amp;order=asc&amp;page_size=1&amp;stopped=early" '
        'data-stopped="early" class="current" aria-current="page">stopped early</a>'
    ) in page
    assert (
        f'href="/trials/runs/{run}?sort=metric&amp;order=asc&amp;page_size=1" data-stopped="all"'
        in page
    )
    # Sorting and paging stay within the filter; the metric form keeps it too.
    assert (
        f'href="/trials/runs/{run}?sort=metric&amp;order=asc&amp;page_size=1&amp;stopped=early'
        '&amp;page=2" rel="next"' in page
    )
    assert (
        f'href="/trials/runs/{run}?sort=trial_id&amp;order=asc&amp;page_size=1&amp;stopped=early"'
        in page
    )
    assert '<input type="hidden" name="stopped" value="early">' in page
    others = dashboard.get(f"/runs/{run}", params={"stopped": "not_early", "page_size": 50}).text
    kept = re.findall(r'data-trial="(mnist-\d+)">', others.split('<table class="leaderboard"')[1])
    assert len(kept) == 10 and "mnist-01" not in kept and "mnist-04" not in kept
    assert dashboard.get(f"/runs/{run}", params={"stopped": "maybe"}).status_code == 422


def test_a_trial_page_shows_its_asha_rungs_and_pbt_lineage(dashboard, trials_store):
    _record_decisions(trials_store, dashboard.seeded.run)
    trials_store.record_exploit(
        "mnist-07",
        iteration=2,
        donor_trial_id="mnist-00",
        donor_checkpoint=f"/ckpt/{HOSTILE}",
        old_config={"lr": 0.1},
        new_config={"lr": 0.1, HOSTILE: HOSTILE},
        operations={},
    )
    asha = dashboard.get("/trials/mnist-05").text
    cells = r'\s*<td class="num">([^<]*)</td>'
    rungs = re.findall(
        r'<tr class="verdict-[^"]*">' + cells * 3 + r"\s*<td>([^<]*)</td>",
        asha.split("<h2>ASHA rungs</h2>")[1],
    )
    assert rungs == [
        ("1", "1", "0.3", "CONTINUE"),
        ("4", "4", "0.2", "STOP"),
        ("16", "16", "0.1", "recorded at end"),
    ]
    assert f'<td class="reason">{escape(ASHA_STOP)}</td>' in asha
    lineage = (
        dashboard.get("/trials/mnist-06").text.split("<h2>PBT lineage</h2>")[1].split("</table>")[0]
    )
    assert (
        '<td class="id"><a href="/trials/trials/mnist-05">mnist-05</a></td>' in lineage
    )  # a donor's own exploit
    assert '<td class="id"><a href="/trials/trials/mnist-00">mnist-00</a></td>' in lineage
    assert (
        '<td class="id">mnist-06</td>' in lineage
        and '<td class="path">/ckpt/mnist-05/8</td>' in lineage
    )
    assert (
        '<span class="k">lr</span>: 0.01429 → 0.144 <span class="muted">(x 1.2 = 0.144)</span>'
        in lineage
    )
    hostile = dashboard.get("/trials/mnist-07").text
    assert f'<span class="k">{escape(HOSTILE)}</span>: - → {escape(HOSTILE)}' in hostile
    assert hostile.count("<script") == 1  # the theme script only
    plain = dashboard.get("/trials/mnist-00").text
    assert "ASHA rungs" not in plain and "PBT lineage" not in plain


def test_a_warm_started_trial_links_to_the_run_and_trial_it_came_from(dashboard, trials_store):
    run = dashboard.seeded.run
    trials_store.upsert_trial(
        "mnist-warm",
        trainable="pkg.train:fn",
        config={"lr": 0.1, "layers": 0},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run,
        warm_start={
            "run_key": "manual__2026-11-21",
            "experiment_run_id": run,
            "trial_id": "mnist-00",
            "value": 0.25,
            "checkpoint": "/ckpt/mnist-00/10",
        },
    )
    page = dashboard.get("/trials/mnist-warm").text
    assert (
        '<td class="warm-start">trial <a href="/trials/trials/mnist-00">mnist-00</a> of run '
        f'<a href="/trials/runs/{run}">manual__2026-11-21</a> (best loss 0.25), from its '
        "checkpoint "
        "<code>/ckpt/mnist-00/10</code></td>"
    ) in page
    assert (
        dashboard.get("/api/trials/mnist-warm").json()["trial"]["warm_start"]["trial_id"]
        == "mnist-00"
    )
    assert "warm-started from" not in dashboard.get("/trials/mnist-00").text


def test_the_stylesheet_keeps_numbers_on_one_line_and_has_a_dark_theme(dashboard):
    css = dashboard.get("/static/dashboard.css").text
    rules = dict(re.findall(r"^([^{}/@\n][^{}\n]*?)\s*\{([^}]*)\}", css, flags=re.M))
    nowrap = next(v for k, v in rules.items() if "td.num" in k.split(", "))
    assert "white-space: nowrap" in nowrap and "tabular-nums" in nowrap
    assert "text-align: right" in next(v for k, v in rules.items() if k == "td.num, th.num")
    assert "overflow-wrap: normal" in rules["td.config.num"]  # unlike the string cells
    dark = rules[':root[data-theme="dark"]']
    assert "--bg: #161d2d" in dark  # the Airflow UI's dark background
    assert ':root:not([data-theme="light"])' in css.split("prefers-color-scheme: dark")[1]


def test_the_theme_script_is_the_only_one_and_the_policy_admits_it_by_its_hash(dashboard):
    response = dashboard.get(f"/runs/{dashboard.seeded.run}")
    scripts = re.findall(r"<script>(.*?)</script>", response.text, flags=re.S)
    assert scripts == [THEME_SCRIPT]
    served_hash = (
        "sha256-" + base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    )
    assert served_hash == THEME_SCRIPT_HASH
    policy = response.headers["content-security-policy"]
    assert f"script-src '{THEME_SCRIPT_HASH}';" in policy and "unsafe" not in policy
    assert "localStorage.getItem('theme')" in THEME_SCRIPT  # next-themes' key in the Airflow UI


def test_the_error_page_carries_the_theme_script_too(dashboard):
    response = dashboard.get("/runs/999999")
    assert response.status_code == 404 and f"<script>{THEME_SCRIPT}</script>" in response.text


def test_the_chart_draws_text_and_axes_in_the_pages_text_color():
    svg = learning_curves_svg(
        {"a": [(1, 0.5), (2, 0.4)], "b": [(1, 0.6)]}, metric="loss", best_trial_id="a"
    )
    assert 'fill="currentColor"' in svg.split(">", 1)[0]  # the <svg>: every text inherits it
    assert '<g class="axes" stroke="currentColor"' in svg
    assert 'class="grid" stroke="currentColor"' in svg
    assert not re.search(
        r'(fill|stroke)="#(444|888|eee)"', svg
    )  # no fixed grey that vanishes in one mode
