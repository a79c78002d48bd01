"""A real headless Chromium draws the parallel coordinates and slice plot of a 1,000-trial run, and
the Pareto scatter of a two-metric run with constraints, from one real ``airflow api-server``.

Screenshots and DOMs are saved under the module's temporary directory (``browser.save``).
"""

from __future__ import annotations

import math
import random

import pytest

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.plugins.charts.kit import ACCENT
from tests.factories import add_results
from tests.pareto_seed import register_metrics
from tests.plugins.browser_support import launch_chromium, needs_chromium, start_api_server

pytestmark = needs_chromium

BIG_TRIALS = 1000
TRADEOFF_TRIALS = 80
LATENCY_BOUND = 40.0


def _trial(store, trial_id: str, run: int, index: int, config: dict, results: list) -> None:
    store.upsert_trial(
        trial_id,
        trainable="pkg.train:fn",
        config=config,
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run,
        dag_id="tune_big",
        run_id="r1",
        task_id="trial",
        map_index=index,
    )
    store.record_transition(trial_id, Transition.PLACED)
    add_results(store, trial_id, results)
    store.record_end(TrialEnd(trial_id, "x", TrialStatus.TERMINATED))


def seed(store) -> dict:
    """A 1,000-trial run of one metric (loss, min) over lr (log-uniform), layers, dropout and
    an activation; and an 80-trial run of max val_acc and min latency with a constraint on
    latency. Returns the runs and each trade-off trial's values."""
    rng = random.Random(31)
    store.ensure_experiment("big", metric="loss", mode="min")
    big = store.create_experiment_run("big", "r1", dag_id="tune_big", run_id="r1")
    losses = {}
    for i in range(BIG_TRIALS):
        lr = 10 ** rng.uniform(-5, -1)
        layers = rng.randint(1, 8)
        act = rng.choice(["relu", "gelu", "tanh"])
        dropout = rng.choice([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
        loss = abs(math.log10(lr) + 3) * 0.3 + 0.05 * abs(layers - 4) + dropout * 0.4
        loss += {"relu": 0.0, "gelu": -0.05, "tanh": 0.15}[act] + rng.uniform(0, 0.1)
        losses[f"big-{i:04d}"] = loss
        config = {"lr": lr, "layers": layers, "activation": act, "dropout": dropout}
        _trial(store, f"big-{i:04d}", big, i, config, [{"training_iteration": 1, "loss": loss}])
    store.finish_experiment_run(big, "SUCCESS")  # finished: the pages do not reload

    register_metrics(store, "tradeoff", ["val_acc", "latency"], ["max", "min"])
    store.ensure_experiment("tradeoff", constraints=[f"latency <= {LATENCY_BOUND}"])
    tradeoff = store.create_experiment_run("tradeoff", "r1", dag_id="tune_big", run_id="r1")
    values = {}
    for i in range(TRADEOFF_TRIALS):
        size = rng.uniform(0, 1)
        val_acc = round(0.55 + 0.4 * size**0.5 - rng.uniform(0, 0.12), 4)
        latency = round(5 + 70 * size + rng.uniform(0, 8), 2)
        values[f"tr-{i:02d}"] = (val_acc, latency)
        result = {"training_iteration": 1, "val_acc": val_acc, "latency": latency}
        _trial(store, f"tr-{i:02d}", tradeoff, i, {"size": size}, [result])
    store.finish_experiment_run(tradeoff, "SUCCESS")
    return {"big": big, "losses": losses, "tradeoff": tradeoff, "values": values}


@pytest.fixture(scope="module")
def server(airflow_home, tmp_path_factory):
    """(base URL, token, what was seeded, the directory for screenshots) of one api-server."""
    from airflow_trials.store import TrialStore

    directory = tmp_path_factory.mktemp("browser-coordinates")
    url = f"sqlite:///{directory / 'trials.db'}"
    store = TrialStore(url, create=True)
    seeded = seed(store)
    store.dispose()
    with start_api_server(url, directory) as (base, token):
        yield base, token, seeded, directory


@pytest.fixture(scope="module")
def browser(server):
    base, token, _, directory = server
    with launch_chromium(directory) as found:
        found.call("Network.setCookie", name="_token", value=token, url=base + "/")
        yield found


@pytest.mark.timeout(600)
def test_chromium_draws_a_thousand_trials_on_parallel_coordinates(server, browser):
    base, _, seeded, directory = server
    browser.open(f"{base}/trials/runs/{seeded['big']}")
    link = browser.eval("document.querySelector('a.coordinates-link').getAttribute('href')")
    assert link == f"/trials/runs/{seeded['big']}/coordinates"

    browser.open(f"{base}{link}")
    shot = browser.save(directory, "coordinates")
    svg = "document.querySelector('svg.coordinates')"
    assert browser.eval(f"{svg}.querySelectorAll('polyline').length") == BIG_TRIALS
    assert browser.eval(f"{svg}.querySelectorAll('polyline.top').length") == 10
    best = sorted(seeded["losses"], key=seeded["losses"].get)[:10]
    # The emphasised lines are the ten best, drawn last, the best of all on top.
    drawn = browser.eval(
        f"[...{svg}.querySelectorAll('polyline')].slice(-10).map(p => p.dataset.trial)"
    )
    assert drawn == best[::-1]
    assert browser.eval(f"{svg}.querySelector('polyline.top').getAttribute('stroke')") == ACCENT
    # Five axes (activation, dropout, layers, lr, the metric), each line crossing all of them.
    assert browser.eval(f"[...{svg}.querySelectorAll('g.axis')].map(g => g.dataset.key)") == [
        "activation",
        "dropout",
        "layers",
        "lr",
        "loss",
    ]
    assert browser.eval(
        f"[...{svg}.querySelectorAll('polyline')].every(p => p.points.length === 5)"
    )
    # lr spans four decades: a log axis; dropout (0 to 0.5) a linear one.
    assert (
        browser.eval(f"[...{svg}.querySelectorAll('g.axis')].map(g => g.textContent)")[3].count(
            "log"
        )
        == 1
    )
    assert (
        "log"
        not in browser.eval(f"[...{svg}.querySelectorAll('g.axis')].map(g => g.textContent)")[1]
    )
    box = browser.eval(
        f"(() => {{ const r = {svg}.getBoundingClientRect(); return [r.width, r.height]; }})()"
    )
    assert box[0] > 800 and box[1] > 350
    size = browser.eval(f"{svg}.outerHTML.length")
    assert size < 300_000, size
    assert shot.stat().st_size > 50_000
    assert browser.eval("[...document.scripts].length") == 1  # the theme line only

    # The slice plot of lr: one point per trial, a log x-axis, the ten best emphasised.
    browser.open(f"{base}{link}?param=lr")
    browser.save(directory, "slice-lr")
    plot = "document.querySelector('svg.slice')"
    assert browser.eval(f"{plot}.querySelectorAll('circle.point').length") == BIG_TRIALS
    assert browser.eval(f"{plot}.querySelectorAll('circle.point.top').length") == 10
    assert browser.eval(f"{plot}.querySelector('text.x-label').textContent") == "lr (log)"
    assert browser.eval("document.querySelector('a.param-link.current').dataset.param") == "lr"

    browser.open(f"{base}{link}?param=activation")  # categorical: three columns of points
    browser.save(directory, "slice-activation")
    columns = browser.eval(
        "new Set([...document.querySelectorAll('svg.slice circle.point')]"
        ".map(c => c.getAttribute('cx'))).size"
    )
    assert columns == 3


def _front(values: dict[str, tuple[float, float]]) -> set[str]:
    """The feasible trials no other feasible trial beats on max val_acc and min latency."""
    feasible = {t: v for t, v in values.items() if v[1] <= LATENCY_BOUND}

    def beaten(a: tuple[float, float]) -> bool:
        return any(b[0] >= a[0] and b[1] <= a[1] and b != a for b in feasible.values())

    return {t for t, v in feasible.items() if not beaten(v)}


@pytest.mark.timeout(600)
def test_chromium_draws_the_pareto_front_of_a_two_metric_run(server, browser):
    base, _, seeded, directory = server
    browser.open(f"{base}/trials/runs/{seeded['tradeoff']}")
    browser.save(directory, "pareto")
    svg = "document.querySelector('svg.pareto')"
    front = _front(seeded["values"])
    infeasible = {t for t, v in seeded["values"].items() if v[1] > LATENCY_BOUND}
    assert (
        set(browser.eval(f"[...{svg}.querySelectorAll('circle.front')].map(c => c.dataset.trial)"))
        == front
    )
    assert (
        set(
            browser.eval(
                f"[...{svg}.querySelectorAll('path.infeasible')].map(c => c.dataset.trial)"
            )
        )
        == infeasible
    )
    dominated = set(seeded["values"]) - front - infeasible
    assert browser.eval(f"{svg}.querySelectorAll('circle.dominated').length") == len(dominated)
    # The step line: through every front point, with a corner between neighbours.
    assert browser.eval(f"{svg}.querySelector('polyline.front-step').points.length") == (
        2 * len(front) - 1
    )
    # Higher val_acc to the right, higher latency up: along the front, more accuracy costs
    # latency, so from left to right the points climb (SVG y falls).
    xs, ys = zip(
        *browser.eval(
            f"[...{svg}.querySelectorAll('circle.front')].map(c => [c.cx.baseVal.value,"
            " c.cy.baseVal.value]).sort((a, b) => a[0] - b[0])"
        ),
        strict=True,
    )
    assert list(ys) == sorted(ys, reverse=True)
    assert list(xs) == sorted(xs)
    box = browser.eval(
        f"(() => {{ const r = {svg}.getBoundingClientRect(); return [r.width, r.height]; }})()"
    )
    assert box[0] > 800 and box[1] > 350
    assert browser.eval("document.querySelector('p.pareto-note').innerText").startswith(
        "Every trial by its last result on max val_acc and min latency"
    )

    browser.call(
        "Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": "dark"}]
    )
    try:
        browser.open(f"{base}/trials/runs/{seeded['big']}/coordinates")
        browser.save(directory, "coordinates-dark")
        color = browser.eval("getComputedStyle(document.querySelector('svg.coordinates')).color")
        assert color == "rgb(227, 232, 240)"  # the page's light text on the dark background
    finally:
        browser.call("Emulation.setEmulatedMedia", features=[])
