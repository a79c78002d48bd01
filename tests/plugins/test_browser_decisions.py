"""A real headless Chromium loads a run's scheduler decisions from a real ``airflow api-server``:
the ASHA rungs of a 1,000-trial run (its rule's real verdicts) and the lineage graph of a PBT
population larger than the graph shows. One server for the module; screenshots and DOMs are saved
under the module's tmp directory."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from airflow_trials.plugins.services.decisions import LINEAGE_TRIALS_SHOWN
from tests.plugins.browser_support import (
    Browser,
    launch_chromium,
    needs_chromium,
    start_api_server,
)
from tests.plugins.decisions_seed import asha_run, pbt_run

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("browser-decisions")


@pytest.fixture(scope="module")
def server(airflow_home, module_dir):
    """``airflow api-server`` over a trials DB with a 1,000-trial ASHA run, a HyperBand run and
    a 300-trial PBT run; yields (base URL, token, {name: SeededRun})."""
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{module_dir / 'trials.db'}"
    store = TrialStore(url, create=True)
    runs = {
        "asha": asha_run(store, "asha", 1000, bulk=True),
        "hyperband": asha_run(store, "hyperband", 150, brackets=3, bulk=True),
        "pbt": pbt_run(store, "pbt", 300, generations=4, bulk=True),
    }
    store.dispose()
    with start_api_server(url, module_dir) as (base, token):
        yield base, token, runs


@pytest.fixture(scope="module")
def browser(server, module_dir):
    base, token, _ = server
    with launch_chromium(module_dir) as found:
        found.call("Network.setCookie", name="_token", value=token, url=base + "/")
        yield found


def _json(server, path: str) -> Any:
    base, token, _ = server
    response = httpx.get(
        f"{base}/trials{path}", headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    assert response.status_code == 200, response.text
    return response.json()


def _boxes(browser: Browser, selector: str) -> list[dict[str, float]]:
    return browser.eval(
        f"Array.from(document.querySelectorAll({json.dumps(selector)})).map(e => {{"
        "const r = e.getBoundingClientRect();"
        "return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; })"
    )


def _overlapping(boxes: list[dict[str, float]]) -> list[tuple[int, int]]:
    return [
        (i, j)
        for i, a in enumerate(boxes)
        for j, b in enumerate(boxes[i + 1 :], i + 1)
        if a["left"] < b["right"] - 0.5
        and b["left"] < a["right"] - 0.5
        and a["top"] < b["bottom"] - 0.5
        and b["top"] < a["bottom"] - 0.5
    ]


@pytest.mark.timeout(600)
def test_a_1000_trial_asha_run_s_rungs_render(server, browser, module_dir):
    base, _, runs = server
    run = runs["asha"].run
    body = _json(server, f"/api/runs/{run}/decisions")
    browser.open(f"{base}/trials/runs/{run}")
    link = browser.eval("document.querySelector('p.run-decisions a').getAttribute('href')")
    assert link == f"/trials/runs/{run}/decisions"
    browser.save(module_dir, "asha-run-page")

    browser.open(f"{base}{link}")
    shot = browser.save(module_dir, "asha-decisions")
    assert shot.stat().st_size > 10_000
    rows = browser.eval(
        "Array.from(document.querySelectorAll('table.run-rungs tbody tr')).map(r =>"
        " Array.from(r.cells).map(c => c.innerText))"
    )
    assert [row[0] for row in rows] == ["1", "3", "9", "27"]
    assert rows[0][1] == "1000"  # every trial reached the first rung
    for row, rung in zip(rows, body["rungs"], strict=True):
        assert [int(c) for c in row[1:5]] == [
            rung["reached"],
            rung["continued"],
            rung["stopped"],
            rung["recorded_at_end"],
        ]
        assert row[5] == ("-" if rung["cutoff"] is None else f"{rung['cutoff']:.4g}")
    finite = sum(t["value"] is not None for rung in body["rungs"] for t in rung["trials"])
    assert browser.eval(
        "document.querySelectorAll('svg.rungs-chart circle.rung-point').length"
    ) == (finite)
    assert browser.eval(
        "document.querySelectorAll('svg.rungs-chart circle.rung-point.stopped').length"
    ) == sum(r["stopped"] for r in body["rungs"])
    assert browser.eval("document.querySelectorAll('svg.rungs-chart line.cutoff').length") == sum(
        r["cutoff"] is not None for r in body["rungs"]
    )
    # The chart fits the page, its labels are readable and apart.
    chart = _boxes(browser, "svg.rungs-chart")[0]
    assert chart["right"] <= browser.eval("document.documentElement.clientWidth")
    assert chart["bottom"] - chart["top"] > 250
    assert not _overlapping(_boxes(browser, "svg.rungs-chart .legend text"))
    assert not _overlapping(_boxes(browser, "svg.rungs-chart text.milestone"))
    size = browser.eval(
        "parseFloat(getComputedStyle(document.querySelector('svg.rungs-chart text.milestone'))"
        ".fontSize)"
    )
    assert size >= 10
    # A stopped trial's dot links to its trial page, and says why in its tooltip.
    tip = browser.eval(
        "document.querySelector('svg.rungs-chart circle.rung-point.stopped title').textContent"
    )
    assert "(STOP): stopped by ASHA at training_iteration=" in tip and "cutoff" in tip


@pytest.mark.timeout(600)
def test_hyperband_brackets_each_get_a_chart(server, browser, module_dir):
    base, _, runs = server
    browser.open(f"{base}/trials/runs/{runs['hyperband'].run}/decisions")
    browser.save(module_dir, "hyperband-decisions")
    assert browser.eval("Array.from(document.querySelectorAll('h3')).map(h => h.innerText)") == [
        "Bracket 1 of 3",
        "Bracket 2 of 3",
        "Bracket 3 of 3",
    ]
    assert browser.eval("document.querySelectorAll('svg.rungs-chart').length") == 3


@pytest.mark.timeout(600)
def test_a_pbt_population_s_lineage_graph_shows_the_busiest_trials(server, browser, module_dir):
    base, _, runs = server
    seeded = runs["pbt"]
    exploits = _json(server, f"/api/runs/{seeded.run}/decisions")["exploits"]
    assert len(exploits) == len(seeded.exploits)
    browser.open(f"{base}/trials/runs/{seeded.run}")
    assert f"{len(exploits)} PBT exploits" in browser.eval(
        "document.querySelector('p.run-decisions').innerText"
    )
    browser.open(f"{base}/trials/runs/{seeded.run}/decisions")
    browser.save(module_dir, "pbt-decisions")
    section = browser.eval(
        "Object.assign({}, document.querySelector('section.run-lineage').dataset)"
    )
    involved = len({t for e in seeded.exploits for t in e[:2]})
    assert section == {
        "trials": str(involved),
        "shown": str(LINEAGE_TRIALS_SHOWN),
        "exploits": str(len(exploits)),
    }
    assert "trials in the most exploits are shown" in browser.eval(
        "document.querySelector('strong.capped').innerText"
    )
    labels = _boxes(browser, "svg.lineage-chart text.trial-label")
    assert len(labels) == LINEAGE_TRIALS_SHOWN
    assert not _overlapping(labels)  # one readable row per trial
    arrows = browser.eval(
        "Array.from(document.querySelectorAll('svg.lineage-chart g.exploit')).map(g =>"
        " [g.dataset.trial, g.dataset.donor, +g.dataset.iteration, g.querySelector('title')"
        ".textContent])"
    )
    shown = set(
        browser.eval(
            "Array.from(document.querySelectorAll('svg.lineage-chart text.trial-label'))"
            ".map(t => t.dataset.trial)"
        )
    )
    between = [e for e in seeded.exploits if e[0] in shown and e[1] in shown]
    assert [tuple(a[:3]) for a in arrows] == between and between
    trial, donor, iteration, tip = arrows[0]
    assert tip.startswith(f"{trial} copied {donor}'s checkpoint at iteration {iteration} (")
    assert "lr " in tip and "→" in tip
    chart = _boxes(browser, "svg.lineage-chart")[0]
    assert chart["right"] <= browser.eval("document.documentElement.clientWidth")
    # The listed exploits: the newest first.
    first_row = browser.eval(
        "Array.from(document.querySelector('table.run-exploits tbody tr').cells).map(c =>"
        " c.innerText)"
    )
    newest = exploits[-1]
    assert first_row[:3] == [newest["trial_id"], newest["donor_trial_id"], str(newest["iteration"])]


@pytest.mark.timeout(600)
def test_the_charts_read_in_dark_mode(server, browser, module_dir):
    base, _, runs = server
    browser.call(
        "Emulation.setEmulatedMedia",
        features=[{"name": "prefers-color-scheme", "value": "dark"}],
    )
    try:
        browser.open(f"{base}/trials/runs/{runs['asha'].run}/decisions")
        browser.save(module_dir, "asha-decisions-dark")
        color = browser.eval("getComputedStyle(document.querySelector('svg.rungs-chart')).color")
        background = browser.eval("getComputedStyle(document.body).backgroundColor")
        assert color != background
        channels = [int(c) for c in color[color.index("(") + 1 : -1].split(",")[:3]]
        assert sum(channels) > 450  # light text on the dark page
    finally:
        browser.call("Emulation.setEmulatedMedia", features=[])
