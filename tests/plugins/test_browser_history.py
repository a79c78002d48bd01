"""A real headless Chromium loads an experiment's history across runs from a real
``airflow api-server``: the trend chart's points, the changed-key markers and the warm-start link,
with one run of 1,000 trials among the nightly runs. Screenshots are saved under the module's
tmp directory."""

from __future__ import annotations

import pytest

from tests.plugins.browser_support import launch_chromium, needs_chromium, start_api_server
from tests.plugins.history_seed import EXPERIMENT, seed_nightly

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def history_server(airflow_home, tmp_path_factory):
    """One ``airflow api-server`` for the module, over 4 nightly runs (the last warm-started) and a
    fifth of 1,000 trials; yields (base URL, token, what was seeded, a directory)."""
    from airflow_trials.store import TrialStore

    directory = tmp_path_factory.mktemp("browser_history")
    url = f"sqlite:///{directory / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        seeded = seed_nightly(store, nights=4, big_night_trials=1_000)
    finally:
        store.dispose()
    with start_api_server(url, directory) as (base, token):
        yield base, token, seeded, directory


@pytest.mark.timeout(900)
def test_chromium_renders_the_history(history_server, tmp_path):
    base, token, seeded, _ = history_server
    nights = seeded.nights
    with launch_chromium(tmp_path) as browser:
        browser.call("Network.setCookie", name="_token", value=token, url=base + "/")
        browser.open(f"{base}/trials/experiments/{EXPERIMENT}")
        shot = browser.save(tmp_path, "history")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

        rows = browser.eval(
            "[...document.querySelectorAll('tr.history-row')].map(r => r.dataset.runKey)"
        )
        assert rows == [n.run_key for n in reversed(nights)]  # newest first
        trials = browser.eval(
            "[...document.querySelectorAll('tr.history-row td:nth-child(4)')]"
            ".map(td => td.innerText)"
        )
        assert trials == ["1000", "6", "6", "6", "6"]

        # One point per run, in date order, left to right; the best run (the 1,000 trials, 0.3)
        # is the red one, lowest on the chart.
        points = browser.eval(
            "[...document.querySelectorAll('svg.trend circle.trend-point')].map(c =>"
            " [c.dataset.run, +c.dataset.value, +c.getAttribute('cx'), +c.getAttribute('cy')])"
        )
        assert [p[0] for p in points] == [n.run_key for n in nights]
        assert [p[1] for p in points] == [n.best_value for n in nights]
        xs = [p[2] for p in points]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
        lowest = max(points, key=lambda p: p[3])  # SVG y grows downwards
        assert lowest[0] == nights[-1].run_key
        best = browser.eval(
            "document.querySelector('svg.trend circle.trend-point.best').dataset.run"
        )
        assert best == nights[-1].run_key
        box = browser.eval(
            "(() => { const r = document.querySelector('svg.trend').getBoundingClientRect();"
            " return [r.width, r.height]; })()"
        )
        assert box[0] > 400 and box[1] > 150

        # The changed keys are marked by a class and a visible marker, not by colour alone.
        changed = browser.eval(
            "[...document.querySelectorAll('tr.history-row')].map(r => [r.dataset.runKey,"
            " [...r.querySelectorAll('.config-key.changed')].map(k => k.dataset.key)])"
        )
        assert dict(changed) == {
            nights[4].run_key: ["dropout", "layers", "lr"],
            nights[3].run_key: ["dropout", "layers"],
            nights[2].run_key: ["lr"],
            nights[1].run_key: [],
            nights[0].run_key: [],
        }
        markers = browser.eval(
            "[...document.querySelectorAll('.config-key.changed .changed-marker')]"
            ".map(m => [m.innerText, getComputedStyle(m).display, m.getBoundingClientRect().width])"
        )
        assert len(markers) == 6 and all(
            m[0] == "Δ" and m[1] != "none" and m[2] > 0 for m in markers
        )
        warm = browser.eval(
            f"document.querySelector('tr[data-run-key=\"{nights[3].run_key}\"] a.warm-link')"
            ".getAttribute('href')"
        )
        assert warm == f"/trials/runs/{nights[2].run}"
        assert browser.eval(
            "document.documentElement.scrollWidth <= document.documentElement.clientWidth + 1"
        )

        browser.open(f"{base}/trials/experiments/{EXPERIMENT}?last=2")
        browser.save(tmp_path, "history-last-2")
        assert browser.eval("document.querySelectorAll('tr.history-row').length") == 2
        assert browser.eval("document.querySelectorAll('circle.trend-point').length") == 2
