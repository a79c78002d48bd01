"""How the pages show values: result timestamps as UTC date-times, durations and numbers that never
wrap, the theme script that follows the Airflow UI's color mode, and a chart legible in both modes."""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from markupsafe import escape

from airflow_trials.plugins.render import (
    THEME_SCRIPT,
    THEME_SCRIPT_HASH,
    is_number,
    result_value,
    utc,
)
from airflow_trials.plugins.svg import learning_curves_svg
from tests.plugins.conftest import FIRST_RESULT_AT, HOSTILE


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
    assert utc(moment) == utc(moment.astimezone(timezone(timedelta(hours=-7)))) == "2026-11-21 03:12:45"
    assert utc(moment.replace(tzinfo=None)) == "2026-11-21 03:12:45"  # the store's naive values are UTC
    assert utc(moment.timestamp()) == "2026-11-21 03:12:45"


@pytest.mark.parametrize(("value", "numeric"), [(1, True), (0.5, True), (True, False), ("1", False), (None, False)])
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
    # The trainable's metrics first, then the engine's fields; training_iteration is the first column.
    assert headings == ["iteration", "acc", "loss", "pid", "time_this_iter_s", "time_total_s", "timestamp (UTC)"]


def test_a_result_value_that_is_not_a_date_is_shown_escaped(dashboard, trials_store):
    trials_store.add_results("mnist-11", [{"training_iteration": 1, "timestamp": 1795230765.0},
                                          {"training_iteration": 2, "loss": 0.4}])
    # A trainable may report a field of the engine's name holding anything: the store keeps it.
    trials_store.add_results("mnist-11", [{"training_iteration": 3, "timestamp": HOSTILE}])
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
    served_hash = "sha256-" + base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert served_hash == THEME_SCRIPT_HASH
    policy = response.headers["content-security-policy"]
    assert f"script-src '{THEME_SCRIPT_HASH}';" in policy and "unsafe" not in policy
    assert "localStorage.getItem('theme')" in THEME_SCRIPT  # next-themes' key in the Airflow UI


def test_the_error_page_carries_the_theme_script_too(dashboard):
    response = dashboard.get("/runs/999999")
    assert response.status_code == 404 and f"<script>{THEME_SCRIPT}</script>" in response.text


def test_the_chart_draws_text_and_axes_in_the_pages_text_color():
    svg = learning_curves_svg({"a": [(1, 0.5), (2, 0.4)], "b": [(1, 0.6)]}, metric="loss", best_trial_id="a")
    assert 'fill="currentColor"' in svg.split(">", 1)[0]  # the <svg>: every text inherits it
    assert '<g class="axes" stroke="currentColor"' in svg
    assert 'class="grid" stroke="currentColor"' in svg
    assert not re.search(r'(fill|stroke)="#(444|888|eee)"', svg)  # no fixed grey that vanishes in one mode
