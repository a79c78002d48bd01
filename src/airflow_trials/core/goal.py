"""A run's goal: the metrics its trials are ranked by, each one's mode, and its constraints,
resolved once from the experiment's record and a reader's override (the CLI's ``--metric`` and
``--mode``, the dashboard's ``?metric=`` and ``?mode=``, ``ResultGrid``'s ``metric=`` and
``mode=``)::

    from airflow_trials.core.goal import CLI_FLAGS, Goal

    goal = Goal.recorded("val_loss", "min")
    goal.pick("val_loss", None, CLI_FLAGS)     # Goal(("val_loss",), ("min",)): its own mode
    goal.pick("val_acc", "max", CLI_FLAGS)     # Goal(("val_acc",), ("max",))
    goal.pick("val_acc", None, CLI_FLAGS)      # ModeNeeded: "... pass --mode min or --mode max ..."

A metric the experiment records keeps its recorded mode; any other metric has no mode to keep,
so it must come with one, or it would be ranked the wrong way round (the lowest accuracy
first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_trials.core.pareto import MODES, MetricSpec, ModeSpec, decode_metrics


@dataclass(frozen=True)
class Flags:
    """How a reader spells the metric and mode it asks for, in messages: ``--mode max``,
    ``?mode=max``, ``mode='max'``.

    :param metric: the metric's flag.
    :param mode: the mode's flag.
    :param form: a flag with its value, from ``flag`` and ``value``.
    """

    metric: str
    mode: str
    form: str = "{flag} {value}"

    def given(self, flag: str, value: str) -> str:
        return self.form.format(flag=flag, value=value)

    def mode_choices(self, metric: str) -> str:
        """``--mode min or --mode max with --metric val_acc``."""
        return (
            f"{self.given(self.mode, 'min')} or {self.given(self.mode, 'max')} with "
            f"{self.given(self.metric, metric)}"
        )


CLI_FLAGS = Flags("--metric", "--mode")
API_FLAGS = Flags("?metric=", "?mode=", "{flag}{value}")
PYTHON_FLAGS = Flags("metric", "mode", "{flag}={value!r}")


class GoalError(ValueError):
    """A metric or mode asked for that cannot be ranked by; the message names the fix."""


class ModeNeeded(GoalError):
    """A metric that is not the experiment's, asked for without a mode."""


@dataclass(frozen=True)
class Goal:
    """The metrics trials are ranked by, one mode per metric (None: recorded without one),
    the constraints (``"latency <= 5.0"``), and whether the metrics were recorded as a list
    (several at once) rather than one name.

    :param metrics: ``()`` when the experiment records none.
    :param modes: one per metric, in the same order.
    :param constraints: the constraints' canonical strings; default none.
    :param several: recorded as several metrics; default False.
    """

    metrics: tuple[str, ...]
    modes: tuple[str | None, ...]
    constraints: tuple[str, ...] = ()
    several: bool = False

    @classmethod
    def recorded(
        cls, metric: str | None, mode: str | None, constraints: Sequence[str] = ()
    ) -> Goal:
        """The goal the trials DB records: its ``metric`` and ``mode`` columns as stored (several
        metrics as one JSON object, :func:`~airflow_trials.core.pareto.decode_metrics`)."""
        return cls.of(*decode_metrics(metric, mode), constraints)

    @classmethod
    def of(
        cls, metric: MetricSpec | None, mode: ModeSpec | None, constraints: Sequence[str] = ()
    ) -> Goal:
        """The goal of a metric and mode as the package spells them: one name and its mode (or
        None), several as a list of names with a list of modes."""
        if metric is None:
            return cls((), (), tuple(constraints))
        if isinstance(metric, list | tuple):
            modes = list(mode) if isinstance(mode, list | tuple) else [mode] * len(metric)
            return cls(tuple(metric), tuple(modes), tuple(constraints), several=True)
        return cls((metric,), (mode if isinstance(mode, str) else None,), tuple(constraints))

    def mode_of(self, metric: str) -> str | None:
        """The recorded mode of ``metric``; None when it is not one of the goal's metrics."""
        return self.modes[self.metrics.index(metric)] if metric in self.metrics else None

    @property
    def metric(self) -> str | None:
        """The first metric; None without one."""
        return self.metrics[0] if self.metrics else None

    @property
    def mode(self) -> str:
        """The first metric's mode; ``"min"`` when it was recorded without one."""
        return (self.modes[0] if self.modes else None) or "min"

    def first(self) -> Goal:
        """The goal of the first metric alone (itself when it has one metric or none)."""
        if len(self.metrics) <= 1 and not self.several:
            return self
        return Goal(self.metrics[:1], self.modes[:1], self.constraints)

    def pick(self, metric: str | None, mode: str | None, flags: Flags = CLI_FLAGS) -> Goal:
        """The goal a reader asks for: ``metric`` alone in ``mode``, else in its recorded mode
        (None when recorded without one: :attr:`mode` reads it as min); without ``metric``, this
        goal (its one metric in ``mode`` when given).

        :raises ModeNeeded: ``metric`` is not one of the goal's metrics and ``mode`` is None.
        :raises GoalError: ``mode`` is not ``"min"`` or ``"max"``.
        """
        if mode is not None and mode not in MODES:
            raise GoalError(f"{flags.mode.strip('?=')} must be 'min' or 'max', got {mode!r}.")
        if metric is None:
            if mode is None or self.several:
                return self
            return Goal(self.metrics[:1], (mode,) * len(self.metrics[:1]), self.constraints)
        if mode is None and metric not in self.metrics:
            raise ModeNeeded(
                f"{flags.given(flags.metric, metric)} is not a metric the experiment records "
                f"({self.describe() or 'none'}), so it has no mode to rank by; pass "
                f"{flags.mode_choices(metric)}."
            )
        return Goal((metric,), (mode or self.mode_of(metric),), self.constraints)

    def describe(self) -> str:
        """``min val_loss`` or ``max val_acc, min latency``; ``""`` without a metric."""
        return ", ".join(
            f"{mode or 'min'} {metric}"
            for metric, mode in zip(self.metrics, self.modes, strict=True)
        )
