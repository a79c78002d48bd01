"""The chart kit's polyline path is each point's ``px`` and ``py``, to the character, on every
kind of scale: its inline arithmetic on linear scales is only a shortcut."""

from __future__ import annotations

import random

import pytest

from airflow_trials.plugins.charts.kit import Plot
from airflow_trials.plugins.datamodels.chart_scale import Scale

SCALES = {
    "linear": Scale.linear(-3.0, 250.0),
    "narrow": Scale.linear(0.1, 0.1000001),
    "flat": Scale.linear(2.0, 2.0),
    "log": Scale("log", 1e-4, 10.0),
}


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("pad", [0.0, 6.0])
@pytest.mark.parametrize("y_scale", sorted(SCALES))
@pytest.mark.parametrize("x_scale", sorted(SCALES))
def test_a_path_is_every_points_px_and_py(x_scale, y_scale, pad, whole):
    rng = random.Random(f"{x_scale}{y_scale}{pad}{whole}")
    plot = Plot(70, 30, 770, 285, x=SCALES[x_scale], y=SCALES[y_scale], pad=pad, whole=whole)

    def value(scale: Scale) -> float:
        return rng.uniform(scale.low, scale.high) if scale.high > scale.low else scale.low

    points = [(value(plot.x), value(plot.y)) for _ in range(500)]
    points += [(plot.x.low, plot.y.high), (plot.x.high, plot.y.low)]

    assert plot.path(points) == " ".join(f"{plot.px(x)},{plot.py(y)}" for x, y in points)
