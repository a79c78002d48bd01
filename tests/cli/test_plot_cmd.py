"""``airflow-trials plot`` draws the dashboard's learning curves (issue 49): the PNG's lines are
the series ``plotting.learning_curves`` builds, the ones the dashboard's SVG draws: the same
trials, in the same order (the best last, on top), in the same colours, NaN and inf left out."""

from __future__ import annotations

import json
import math
import re

import pytest
from matplotlib.axes import Axes
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.plotting import BEST_COLOR, learning_curves, plot_learning_curves
from airflow_trials.plugins.charts.curves import learning_curves_svg
from tests.plugins.conftest import seed_store

runner = CliRunner()
_POLYLINE = r'<polyline class="curve[^"]*" data-trial="([^"]+)" fill="none" stroke="([^"]+)"'


def _svg_lines(svg: str) -> list[tuple[str, str]]:
    """(trial, colour) of the SVG's polylines, in drawing order."""
    return re.findall(_POLYLINE, svg)


@pytest.fixture
def drawn(monkeypatch) -> list[tuple[str, str, list[float]]]:
    """(label, colour, values) of every line matplotlib draws."""
    lines: list[tuple[str, str, list[float]]] = []
    real = Axes.plot

    def plot(self, xs, ys, **kwargs):
        lines.append((kwargs["label"], kwargs["color"], list(ys)))
        return real(self, xs, ys, **kwargs)

    monkeypatch.setattr(Axes, "plot", plot)
    return lines


def test_the_png_and_the_svg_draw_the_same_series(tmp_path, drawn):
    curves = {
        "t-b": [(1, 0.9), (2, math.nan), (3, 0.5)],
        "t-a": [(1, 0.8), (2, math.inf)],
        "t-c": [(1, 0.3), (2, 0.2)],
        "t-empty": [],
    }
    chart = learning_curves(curves, metric="loss", best_trial_id="t-c")
    assert [(s.trial_id, s.best) for s in chart.series] == [
        ("t-a", False),
        ("t-b", False),
        ("t-c", True),
    ]
    plot_learning_curves(curves, str(tmp_path / "c.png"), metric="loss", best_trial_id="t-c")
    svg = learning_curves_svg(curves, metric="loss", best_trial_id="t-c")
    assert [(label.removesuffix(" (best)"), color) for label, color, _ in drawn] == _svg_lines(svg)
    assert [values for *_, values in drawn] == [[0.8], [0.9, 0.5], [0.3, 0.2]]
    assert drawn[-1][:2] == ("t-c (best)", BEST_COLOR)


def test_the_plot_command_draws_the_dashboards_series(tmp_path, drawn):
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    store = TrialStore(url, create=True)
    try:
        seed_store(store)
        (run,) = store.reader.list_experiment_runs("mnist")
        trial_ids = [t.trial_id for t in store.reader.list_trials(experiment_run_id=run.id)]
        curves = store.reader.metric_curves(trial_ids, "loss")
    finally:
        store.dispose()
    path = tmp_path / "curves.png"
    result = runner.invoke(app, ["plot", "mnist", "--db-url", url, "--out", str(path), "--json"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.stdout)["best_trial_id"]
    svg = learning_curves_svg(curves, metric="loss", best_trial_id=best)
    assert [(label.removesuffix(" (best)"), color) for label, color, _ in drawn] == _svg_lines(svg)
    assert drawn[-1][0] == f"{best} (best)" and path.stat().st_size > 0
