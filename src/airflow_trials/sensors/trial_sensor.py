"""TrialSensor: waits, deferred, for a trial or a whole experiment run started elsewhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue, conf

from airflow_trials.exceptions import TrialError
from airflow_trials.hooks.trials import DEFAULT_TRIALS_CONN_ID, TrialsDbHook
from airflow_trials.triggers.trial_trigger import TrialStatusTrigger, trials_status


class TrialSensor(BaseSensorOperator):
    """Waits until a trial (``trial_id``), or every trial of an experiment run (``run_key``, the
    Airflow run_id of the DAG run that ran the experiment), has ended, reading the trials store.

    Returns ``{"done": True, "statuses": {trial_id: status}, "failed": [...]}`` as XCom; fails
    when a trial ended in ERROR unless ``fail_on_error=False``.

    :param experiment_name: the experiment. Templated.
    :param trial_id: a trial to wait for. Templated.
    :param run_key: or an experiment run to wait for. Templated.
    :param fail_on_error: fail when a waited-for trial is in ERROR; default True.
    :param trials_conn_id: default ``trials_default``.
    :param deferrable: wait in the triggerer, holding no worker slot; default ``[operators]
        default_deferrable`` (False in stock Airflow: the sensor then waits in a worker slot).
    """

    template_fields: Sequence[str] = ("experiment_name", "trial_id", "run_key")

    def __init__(
        self,
        *,
        experiment_name: str,
        trial_id: str | None = None,
        run_key: str | None = None,
        fail_on_error: bool = True,
        trials_conn_id: str = DEFAULT_TRIALS_CONN_ID,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        if (trial_id is None) == (run_key is None):
            raise ValueError("TrialSensor needs exactly one of trial_id or run_key.")
        super().__init__(**kwargs)
        self.experiment_name = experiment_name
        self.trial_id = trial_id
        self.run_key = run_key
        self.fail_on_error = fail_on_error
        self.trials_conn_id = trials_conn_id
        self.deferrable = deferrable

    def _state(self) -> dict[str, Any]:
        store = TrialsDbHook(self.trials_conn_id).get_conn()
        try:
            return trials_status(store, self.experiment_name, self.trial_id, self.run_key)
        finally:
            store.dispose()

    def poke(self, context: Context) -> PokeReturnValue:
        state = self._state()
        if state["done"]:
            self._check(state)
        return PokeReturnValue(is_done=state["done"], xcom_value=state)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        state = self._state()
        if state["done"]:
            return self._check(state)
        self.defer(
            trigger=TrialStatusTrigger(
                self.experiment_name,
                self.trial_id,
                self.run_key,
                self.trials_conn_id,
                self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=self.execution_timeout,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        return self._check(event)

    def _check(self, state: dict[str, Any]) -> dict[str, Any]:
        if self.fail_on_error and state["failed"]:
            what = f"trial {self.trial_id}" if self.trial_id else f"experiment run {self.run_key}"
            raise TrialError(
                f"TrialSensor on {what} of experiment {self.experiment_name}: trials "
                f"{', '.join(state['failed'])} ended in ERROR; see their task logs, or set "
                f"fail_on_error=False to wait for completion only."
            )
        return state
