"""A real headless Chromium loads a run's hyperparameter importances from a real
``airflow api-server``: a run of 1,000 trials, its bar chart sorted and laid out, the run page's
link to it, the dark mode, and the message that stands in for the chart of a run with too few
trials. Screenshots and DOMs are saved under the module's tmp directory."""

from __future__ import annotations

import math
import random
import time
from html import unescape

import httpx
import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.status import TrialStatus
from tests.factories import add_results
from tests.plugins.browser_support import launch_chromium, needs_chromium, start_api_server
from tests.plugins.conftest import seed_store

pytestmark = needs_chromium

BIG_TRIALS = 1000
LONG_NAME = "optimizer/momentum_warmup_fraction_of_the_first_epoch"


def seed_big_run(store) -> int:
    """Run "big-1" of experiment "big" (DAG tune_mnist): 1,000 trials where lr drives the loss;
    every 50th failed before reporting, the others ended TERMINATED."""
    store.ensure_experiment("big", metric="loss", mode="min")
    run = store.create_experiment_run(
        "big",
        "big-1",
        dag_id="tune_mnist",
        run_id="big-1",
        search_space={
            "lr": {"loguniform": [1e-4, 1e-1]},
            "dropout": {"uniform": [0, 0.6]},
            "act": {"choice": ["relu", "tanh", "gelu"]},
            "layers": {"randint": [1, 9]},
            "optimizer": {"momentum_warmup_fraction_of_the_first_epoch": {"uniform": [0, 1]}},
        },
    )
    rng = random.Random(2026)
    for i in range(BIG_TRIALS):
        trial_id = f"big-{i:04d}"
        config = {
            "lr": 10 ** rng.uniform(-4, -1),
            "dropout": rng.uniform(0, 0.6),
            "act": rng.choice(["relu", "tanh", "gelu"]),
            "layers": rng.randint(1, 8),
            "optimizer": {"momentum_warmup_fraction_of_the_first_epoch": rng.random()},
            "epochs": 20,
        }
        store.upsert_trial(
            trial_id,
            trainable="pkg.train:fn",
            config=config,
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
            dag_id="tune_mnist",
            run_id="big-1",
            task_id="big.trial",
            map_index=i,
        )
        if i % 50 == 49:
            continue
        loss = abs(math.log10(config["lr"]) + 2.5) + 0.02 * config["dropout"] + 0.01 * rng.random()
        add_results(store, trial_id, [{"training_iteration": 1, "loss": loss}])
        # Ended: only the trials that count feed the importances (docs/store.md).
        store.record_end(TrialEnd(trial_id, "big", TrialStatus.TERMINATED))
    return run


@pytest.fixture(scope="module")
def server(airflow_home, tmp_path_factory):
    """One ``airflow api-server`` for the module over the conftest's seeded store and the big
    run; yields (base URL, token, seeded, big run id, directory)."""
    from airflow_trials.store import TrialStore

    directory = tmp_path_factory.mktemp("browser_importances")
    url = f"sqlite:///{directory / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        seeded = seed_store(store)
        big = seed_big_run(store)
    finally:
        store.dispose()
    with start_api_server(url, directory) as (base, token):
        yield base, token, seeded, big, directory


@pytest.fixture(scope="module")
def browser(server):
    *_, directory = server
    with launch_chromium(directory) as found:
        yield found


BARS = """(() => [...document.querySelectorAll('svg.importances g.importance')].map(g => {
  const label = g.querySelector('text.param').getBoundingClientRect();
  const bar = g.querySelector('rect.bar').getBoundingClientRect();
  const value = g.querySelector('text.value').getBoundingClientRect();
  return {param: g.dataset.param, share: parseFloat(g.dataset.importance),
          label: [label.left, label.right, label.top, label.bottom],
          bar: [bar.left, bar.right, bar.top, bar.bottom],
          value: [value.left, value.right, value.top, value.bottom],
          text: g.querySelector('text.param').textContent};
}))()"""


@pytest.mark.timeout(900)
def test_chromium_draws_the_importances_of_1000_trials_sorted(server, browser):
    base, token, _, big, directory = server
    browser.call("Network.setCookie", name="_token", value=token, url=base + "/")

    browser.open(f"{base}/trials/runs/{big}")  # the run page links to the importances
    link = browser.eval(
        "document.querySelector('p.importances-link a[data-metric=loss]').getAttribute('href')"
    )
    assert link == f"/trials/runs/{big}/importances?metric=loss"

    browser.open(base + link)
    shot = browser.save(directory, "importances")
    bars = browser.eval(BARS)
    params = [b["param"] for b in bars]
    assert params[0] == "lr"
    assert sorted(params) == sorted(["lr", "dropout", "act", "layers", unescape(LONG_NAME)])
    shares = [b["share"] for b in bars]
    assert shares == sorted(shares, reverse=True)
    summary = browser.eval("document.querySelector('p.importances-summary').innerText")
    assert summary.startswith("From 980 of the run's 1000 trials; 20 left out")
    assert "epochs" in summary  # the same in every trial
    assert (
        browser.eval("document.querySelectorAll('table.importances tr.importance-row').length") == 5
    )

    svg = browser.eval(
        "(() => { const r = document.querySelector('svg.importances').getBoundingClientRect();"
        " return [r.left, r.right, r.width, r.height]; })()"
    )
    assert svg[2] > 400 and svg[3] > 100  # laid out, not just present in the DOM
    for bar in bars:
        # The name ends left of its bar, the share starts right of it, all inside the chart.
        assert bar["label"][1] <= bar["bar"][0] + 1, bar
        assert bar["value"][0] >= bar["bar"][1], bar
        assert svg[0] <= bar["label"][0] and bar["value"][1] <= svg[1], bar
    tops = sorted(bar["label"][2] for bar in bars)
    heights = [bar["label"][3] - bar["label"][2] for bar in bars]
    assert all(b - a >= max(heights) for a, b in zip(tops, tops[1:], strict=False))  # no overlap
    long = next(b for b in bars if b["param"] == LONG_NAME)
    assert long["text"].endswith("…") and len(long["text"]) <= 36
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert browser.eval(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )

    # The other evaluator, from the page's own link (fANOVA's forest: a few seconds at 1,000).
    fanova = browser.eval("document.querySelector('a[data-evaluator=fanova]').getAttribute('href')")
    browser.open(base + fanova)
    browser.save(directory, "importances-fanova")
    bars = browser.eval(BARS)
    assert bars[0]["param"] == "lr"
    assert [b["share"] for b in bars] == sorted((b["share"] for b in bars), reverse=True)


@pytest.mark.timeout(600)
def test_the_chart_reads_in_dark_mode(server, browser):
    base, token, _, big, directory = server
    browser.call("Network.setCookie", name="_token", value=token, url=base + "/")
    browser.open(f"{base}/trials/runs/{big}/importances")
    browser.eval("localStorage.setItem('theme', 'dark')")
    try:
        browser.open(f"{base}/trials/runs/{big}/importances")
        browser.save(directory, "importances-dark")
        colors = browser.eval(
            "(() => { const svg = document.querySelector('svg.importances');"
            " return [getComputedStyle(document.body).color,"
            " getComputedStyle(svg.querySelector('text.param')).fill,"
            " getComputedStyle(svg.querySelector('rect.bar')).fill,"
            " getComputedStyle(document.body).backgroundColor]; })()"
        )
    finally:
        browser.eval("localStorage.removeItem('theme')")
    body, label, bar, background = colors
    assert label == body == "rgb(227, 232, 240)"  # the page's light text on the dark background
    assert bar == "rgb(122, 184, 255)" and background == "rgb(22, 29, 45)"  # --link, --bg


@pytest.mark.timeout(600)
def test_a_run_with_too_few_trials_shows_why_in_place_of_the_chart(server, browser):
    base, token, seeded, _, directory = server
    browser.call("Network.setCookie", name="_token", value=token, url=base + "/")
    browser.open(f"{base}/trials/runs/{seeded.hostile_run}/importances")
    browser.save(directory, "importances-too-few")
    assert browser.eval("document.querySelector('svg.importances')") is None
    problem = browser.eval("document.querySelector('p.importances-problem').innerText")
    assert f"run h1 (id {seeded.hostile_run}) of experiment hostile" in problem
    assert "0 of its 1 trials reported loss" in problem


def test_the_page_of_1000_trials_takes_well_under_the_run_page_s_refresh(server):
    """Not a timing assertion: the durations are printed for the docs (pytest -s)."""
    base, token, _, big, _ = server
    headers = {"Authorization": f"Bearer {token}"}
    took = {}
    for name, path in (
        ("run page", f"/trials/runs/{big}"),
        ("importances page", f"/trials/runs/{big}/importances"),
        ("importances JSON", f"/trials/api/runs/{big}/importances"),
    ):
        httpx.get(base + path, headers=headers, timeout=120)  # warm
        started = time.perf_counter()
        response = httpx.get(base + path, headers=headers, timeout=120)
        took[name] = round((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text
    body = httpx.get(f"{base}/trials/api/runs/{big}/importances", headers=headers, timeout=120)
    assert body.json()["trials"] == 980
    print(f"\n{BIG_TRIALS} trials, milliseconds per request (warm): {took}")
