"""Config values, metric names and tracebacks are shown escaped; no script runs on the pages but the
fixed theme script."""

from __future__ import annotations

import pytest
from markupsafe import escape

from airflow_trials.plugins.charts.curves import learning_curves_svg
from airflow_trials.plugins.web.render import THEME_SCRIPT, THEME_SCRIPT_HASH
from tests.plugins.conftest import HOSTILE

ESCAPED = str(escape(HOSTILE))


@pytest.mark.parametrize("page", ["run", "curves", "trial", "experiments"])
def test_hostile_values_are_escaped_on_every_page(dashboard, page):
    seeded = dashboard.seeded
    path = {
        "run": f"/runs/{seeded.hostile_run}",
        "curves": f"/runs/{seeded.hostile_run}/curves",
        "trial": f"/trials/{seeded.hostile_trial}",
        "experiments": "/",
    }[page]
    response = dashboard.get(path)
    assert response.status_code == 200
    body = response.text.replace(f"<script>{THEME_SCRIPT}</script>", "", 1)
    assert "<script" not in body.lower()
    assert "<img" not in body.lower() and "onerror=alert(2)" not in body.replace(
        "onerror=alert(2)&gt;", ""
    )
    if page in ("run", "trial"):
        assert ESCAPED in body  # shown, as text
        assert str(escape('"><img src=x onerror=alert(2)>')) in body


def test_pages_forbid_scripts_through_their_content_security_policy(dashboard):
    response = dashboard.get(f"/runs/{dashboard.seeded.run}")
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert f"script-src '{THEME_SCRIPT_HASH}';" in policy  # that script, by its hash, and no other
    assert (
        "unsafe-inline" not in policy
        and "'self'" not in policy.split("script-src")[1].split(";")[0]
    )
    assert response.headers["x-content-type-options"] == "nosniff"


def test_the_chart_escapes_trial_ids_and_metric_names():
    svg = learning_curves_svg(
        {HOSTILE: [(1, 0.5), (2, 0.4)]}, metric=HOSTILE, best_trial_id=HOSTILE
    )
    assert "<script" not in svg and ESCAPED in svg
