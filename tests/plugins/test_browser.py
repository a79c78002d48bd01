"""A real headless Chromium loads the dashboard from a real ``airflow api-server``.

The server runs in the session's AIRFLOW_HOME with SimpleAuthManager and the plugin loaded the
way Airflow loads it (the package's entry point); the trials DB is a seeded SQLite file. The
browser is driven over the Chrome DevTools Protocol, because the command line
(``--screenshot``/``--dump-dom``) cannot set the ``_token`` cookie the Airflow UI authenticates
with. Screenshots and DOMs are saved under the test's tmp_path.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from airflow_trials.plugins.web.render import THEME_SCRIPT
from tests.plugins.browser_support import (
    Browser,
    launch_chromium,
    needs_chromium,
    start_api_server,
    wait_for,
)
from tests.plugins.conftest import HOSTILE, TRACEBACK, seed_store

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def api_server(airflow_home, tmp_path_factory):
    """``airflow api-server`` over a seeded trials DB; yields (base URL, token, what was seeded).
    One server for the module: the cases only read, and each has a browser (a profile) of its
    own."""
    from airflow_trials.store import TrialStore

    tmp_path = tmp_path_factory.mktemp("browser_api_server")
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    store = TrialStore(url, create=True)
    seeded = seed_store(store)
    store.dispose()
    with start_api_server(url, tmp_path) as (base, token):
        yield base, token, seeded


@pytest.fixture
def browser(tmp_path):
    with launch_chromium(tmp_path) as found:
        yield found


@pytest.mark.timeout(600)
def test_chromium_renders_the_leaderboard_chart_and_trial_pages(api_server, browser, tmp_path):
    base, token, seeded = api_server
    run_url = f"{base}/trials/runs/{seeded.run}"

    browser.open(run_url)  # no cookie yet: refused
    assert "Not authenticated" in browser.eval("document.body.innerText")
    assert browser.eval("document.querySelectorAll('tr.trial-row').length") == 0

    browser.call("Network.setCookie", name="_token", value=token, url=base + "/")
    browser.open(run_url)
    shot = browser.save(tmp_path, "leaderboard")
    assert browser.eval("document.querySelectorAll('table.leaderboard tr.trial-row').length") == 12
    assert browser.eval(
        "[...document.querySelectorAll('tr.trial-row td:nth-child(2)')].map(td => td.innerText)"
    )[:3] == ["mnist-00", "mnist-01", "mnist-02"]
    assert browser.eval("document.querySelectorAll('svg.curves polyline').length") == 11
    assert (
        browser.eval("document.querySelector('svg.curves polyline.best').dataset.trial")
        == "mnist-00"
    )
    box = browser.eval(
        "(() => { const r = document.querySelector('svg.curves').getBoundingClientRect();"
        " return [r.width, r.height]; })()"
    )
    assert box[0] > 400 and box[1] > 150  # laid out, not just present in the DOM
    assert browser.eval("getComputedStyle(document.querySelector('th')).fontWeight") in (
        "600",
        "700",
    )  # CSS served
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    assert browser.eval(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )
    # Squeezed into a narrow frame, config values that are numbers, and trial ids, stay on one line.
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        width=480,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )
    try:
        # The lines a cell's text takes: its boxes' distinct tops (the cell's own height is its
        # row's).
        count_lines = (
            "(td => { const r = document.createRange(); r.selectNodeContents(td);"
            " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; })"
        )
        lines = browser.eval(
            f"[...document.querySelectorAll('td.config.num, td.id')].map({count_lines})"
        )
        wrapped = browser.eval(
            f"[...document.querySelectorAll('td.path')].some(td => {count_lines}(td) > 1)"
        )
        browser.save(tmp_path, "leaderboard-narrow")
    finally:
        browser.call("Emulation.clearDeviceMetricsOverride")
    assert wrapped  # the frame is narrow enough to wrap what may wrap
    assert lines == [1] * 36  # 12 rows: lr, layers and the trial id

    browser.open(f"{base}/trials/trials/{seeded.failed_trial}")
    browser.save(tmp_path, "trial")
    assert browser.eval("document.querySelector('pre.traceback').innerText") == TRACEBACK
    assert (
        browser.eval("document.querySelector('td[data-key=timestamp]').innerText")
        == "2026-11-21 03:13:15"
    )
    link = browser.eval("document.querySelector('a[target=_top]').getAttribute('href')")
    assert (
        link == "/dags/tune_mnist/runs/manual__2026-11-21/tasks/mnist.trial/mapped/3?try_number=1"
    )

    browser.open(f"{base}/trials/runs/{seeded.hostile_run}")
    browser.save(tmp_path, "hostile")
    assert browser.eval("[...document.scripts].map(s => s.text)") == [THEME_SCRIPT]
    assert HOSTILE in browser.eval("document.body.innerText")  # shown as text, never run
    assert not [e for e in browser.events if e.get("method") == "Page.javascriptDialogOpening"]


LIGHT_BG, DARK_BG = "rgb(255, 255, 255)", "rgb(22, 29, 45)"  # dashboard.css: --bg


def _theme(browser: Browser) -> list[Any]:
    """<html data-theme>, the page's background and text colors, and a chart label's fill."""
    return browser.eval(
        "(() => { const body = getComputedStyle(document.body);"
        " const label = document.querySelector('svg.curves .ticks text');"
        " return [document.documentElement.dataset.theme || null, body.backgroundColor, body.color,"
        " label ? getComputedStyle(label).fill : null]; })()"
    )


@pytest.mark.timeout(600)
def test_the_pages_follow_the_airflow_ui_color_mode(api_server, browser, tmp_path):
    base, token, seeded = api_server
    browser.call("Network.setCookie", name="_token", value=token, url=base + "/")
    system = "prefers-color-scheme"
    browser.call("Emulation.setEmulatedMedia", features=[{"name": system, "value": "light"}])
    pages = {
        "experiments": f"{base}/trials/",
        "run": f"{base}/trials/runs/{seeded.run}",
        "trial": f"{base}/trials/trials/{seeded.failed_trial}",
    }

    browser.open(pages["run"])  # no choice in the Airflow UI yet: the system's (light)
    theme, background, color, label = _theme(browser)
    assert (theme, background) == (None, LIGHT_BG) and label == color

    browser.eval("localStorage.setItem('theme', 'dark')")  # what the Airflow UI's toggle writes
    for name, url in pages.items():
        browser.open(url)
        browser.save(tmp_path, f"dark-{name}")
        theme, background, color, label = _theme(browser)
        assert (theme, background) == ("dark", DARK_BG), name
        assert color == "rgb(227, 232, 240)", name  # light text on the dark background
        if label is not None:
            assert label == color, name  # the chart's labels in the page's text color: legible
    assert (
        browser.eval("document.querySelector('td[data-key=timestamp]').innerText")
        == "2026-11-21 03:13:15"
    )

    # Switched in the Airflow UI while the page is open (another window's write fires "storage"
    # here).
    browser.eval(
        "localStorage.setItem('theme', 'light');"
        " window.dispatchEvent(new StorageEvent('storage', {key: 'theme'}))"
    )
    assert _theme(browser)[:2] == ["light", LIGHT_BG]

    browser.call("Emulation.setEmulatedMedia", features=[{"name": system, "value": "dark"}])
    browser.open(pages["trial"])  # an explicit light choice wins over the system's dark
    assert _theme(browser)[:2] == ["light", LIGHT_BG]
    browser.eval("localStorage.setItem('theme', 'system')")
    browser.open(pages["trial"])
    assert _theme(browser)[:2] == [None, DARK_BG]


@pytest.mark.timeout(600)
def test_the_airflow_ui_shows_the_dashboard_in_its_experiments_entry(api_server, browser, tmp_path):
    base, token, _ = api_server
    browser.call("Network.setCookie", name="_token", value=token, url=base + "/")
    browser.open(f"{base}/plugin/experiments")  # the React UI; it frames the plugin's href

    def framed_rows() -> Any:
        found = browser.eval(
            "(() => { const f = document.querySelector('iframe');"
            " return f && f.contentDocument ? [f.getAttribute('src'),"
            " f.contentDocument.querySelectorAll('tr.experiment-row').length] : null; })()"
        )
        return found if found and found[1] else None

    src, rows = wait_for(framed_rows, 60, "the Experiments frame in the Airflow UI")
    browser.save(tmp_path, "airflow-ui")
    assert (src, rows) == ("/trials/", 3)

    # The frame follows the UI's color mode, and its switch while the frame is open.
    def framed_theme() -> Any:
        return browser.eval(
            "(() => { const d = document.querySelector('iframe').contentDocument;"
            " return d && d.body ? [d.documentElement.dataset.theme || null,"
            " getComputedStyle(d.body).backgroundColor] : null; })()"
        )

    browser.eval("localStorage.setItem('theme', 'dark')")
    browser.open(f"{base}/plugin/experiments")
    wait_for(framed_rows, 60, "the Experiments frame in the dark Airflow UI")
    assert browser.eval(
        "document.documentElement.classList.contains('dark')"
    )  # the UI itself is dark
    assert framed_theme() == ["dark", DARK_BG]
    browser.save(tmp_path, "airflow-ui-dark")
    browser.eval(
        "localStorage.setItem('theme', 'light')"
    )  # as the UI's toggle does, in the top window
    wait_for(
        lambda: framed_theme() == ["light", LIGHT_BG], 30, "the frame to follow the switch to light"
    )


def test_the_api_server_lists_the_plugin_with_its_ui_links(api_server):
    base, token, _ = api_server
    plugins = httpx.get(
        f"{base}/api/v2/plugins", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ).json()
    [plugin] = [p for p in plugins["plugins"] if p["name"] == "airflow_trials_dashboard"]
    assert {v["destination"] for v in plugin["external_views"]} == {
        "nav",
        "dag_run",
        "task_instance",
    }
    errors = httpx.get(
        f"{base}/api/v2/plugins/importErrors",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ).json()
    assert not [e for e in errors["import_errors"] if "airflow_trials" in json.dumps(e)], errors
    response = httpx.get(
        f"{base}/trials/api/experiments", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert [e["name"] for e in response.json()] == ["mnist", "secret", "hostile"]
    assert httpx.get(f"{base}/trials/api/experiments", timeout=30).status_code == 401
