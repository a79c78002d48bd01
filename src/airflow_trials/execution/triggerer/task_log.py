"""TaskLogEcho: a trial watch's polls, written once each to the deferred task's log."""

from __future__ import annotations

from typing import Any

from airflow_trials.core.progress import format_progress
from airflow_trials.core.update import TrialUpdate

# Per poll: a trigger that starts again (a triggerer restart) gets every earlier result back.
MAX_PROGRESS_LINES_PER_POLL = 20


class TaskLogEcho:
    """Logs a trial's new output lines (``[trial stdout] ...``) and one progress line per new
    result, each once, from the updates its polls bring, to the trigger's log: Airflow shows it as
    the deferred task's log for that try.

    A poll's lines go out as one log event per kind (the stream's output lines, the results'
    progress lines), one line each in it: a log event costs the triggerer far more than a line
    (Airflow's structlog processors, its JSON encoding and the write to the task's log), and a
    triggerer watching a thousand trials gets a few results of each per poll.

    :param log: the trigger's logger (its lines land in the task instance's log).
    :param trial_id: the trial.
    """

    def __init__(self, log: Any, trial_id: str) -> None:
        self.log = log
        self.trial_id = trial_id
        self.results_logged = 0  # the index of the first result not logged yet

    def report(self, update: TrialUpdate) -> None:
        """Log what ``update`` brought that was not logged yet: output first (it was printed
        before the results it led to), then the results."""
        for stream, chunk in (update.output or {}).items():
            self._output(stream, chunk)
        self._results(update)

    def ended(self, update: TrialUpdate) -> None:
        """Say where the trial's log files were saved, or why they were not."""
        files = update.log_files
        if files:
            self.log.info(
                "Trial %s: its full stdout and stderr are saved at %s.",
                self.trial_id,
                ", ".join(files[s] for s in sorted(files)),
            )
        if update.log_error:
            self.log.warning("%s", update.log_error)

    def _output(self, stream: str, chunk: dict[str, Any]) -> None:
        skipped_bytes = chunk.get("skipped_bytes", 0)
        skipped_lines = chunk.get("skipped_lines", 0)
        if skipped_bytes or skipped_lines:
            left_out = " and ".join(
                filter(
                    None,
                    (
                        f"{skipped_bytes} bytes" if skipped_bytes else "",
                        f"{skipped_lines} lines" if skipped_lines else "",
                    ),
                )
            )
            self.log.info(
                "[trial %s] ... %s of output left out here (more than one poll shows); "
                "the whole file is %s on the trial's node, and in the trial's logs/ "
                "directory once it ends.",
                stream,
                left_out,
                chunk.get("path"),
            )
        lines = chunk.get("lines", ())
        if lines:
            self.log.info("%s", "\n".join(f"[trial {stream}] {line}" for line in lines))

    def _results(self, update: TrialUpdate) -> None:
        results = update.results
        total = len(results) if update.num_results is None else update.num_results
        first = total - len(results)  # the index of results[0] among all the trial's results
        new = results[max(0, self.results_logged - first) :]
        if len(new) > MAX_PROGRESS_LINES_PER_POLL:
            self.log.info(
                "Trial %s: %d new results; the newest %d follow (all of them are in the "
                "trials DB).",
                self.trial_id,
                len(new),
                MAX_PROGRESS_LINES_PER_POLL,
            )
            new = new[-MAX_PROGRESS_LINES_PER_POLL:]
        if new:
            self.log.info("%s", "\n".join(format_progress(self.trial_id, r) for r in new))
        self.results_logged = max(self.results_logged, total)
