"""Computed hyperparameter importances kept in a file, keyed by what they were computed from.

Computing a run's importances takes milliseconds for a few trials, but Optuna's
``optuna.importance`` imports scikit-learn and SciPy first: seconds in every new process, which
each ``airflow-trials importances`` call is. A file per answer, named by the SHA-256 of its
inputs (the trials' configs and values, the parameters' distributions, the metric, mode and
evaluator, the fANOVA settings, and the versions of Optuna and airflow_trials), lets a later call
read the answer without importing Optuna. A key never goes stale: a new result, a trial's end or
another Optuna gives other inputs, so another file (the oldest beyond :data:`MAX_FILES` are
deleted). The directory is ``$XDG_CACHE_HOME/airflow_trials/importances``, else
``~/.cache/airflow_trials/importances``.

Example::

    from airflow_trials.searchers.importances_cache import ImportancesCache

    cache = ImportancesCache()
    found = cache.get_or_compute(data, "ped-anova")   # computed once, then read from the file
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_trials.core.importances import ImportanceInput, Importances, ParamImportance, ParamSpec
from airflow_trials.searchers.optuna_importances import (
    FANOVA_MAX_DEPTH,
    FANOVA_SEED,
    FANOVA_TREES,
    evaluate_importances,
)

#: Bumped when a cached file's layout, or what the same inputs compute to, changes.
CACHE_FORMAT = 1
#: The most answers kept; writing one more deletes the oldest beyond it.
MAX_FILES = 256
log = logging.getLogger(__name__)

Compute = Callable[[ImportanceInput, str], Importances]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/airflow_trials/importances``, else under ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "airflow_trials" / "importances"


class ImportancesCache:
    """Importances computed once per set of inputs, then read from a JSON file.

    :param directory: where the files are; default :func:`default_cache_dir`.
    """

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory if directory is not None else default_cache_dir()

    def get_or_compute(
        self, data: ImportanceInput, evaluator: str, compute: Compute = evaluate_importances
    ) -> Importances:
        """The importances of ``data`` by ``evaluator``: the cached answer for these inputs, else
        ``compute(data, evaluator)``, written to the cache for the next call.

        :param data: from :func:`~airflow_trials.core.importances.prepare_importances`.
        :param evaluator: ``"ped-anova"`` or ``"fanova"``.
        :param compute: how to compute on a miss; default
            :func:`~airflow_trials.searchers.optuna_importances.evaluate_importances`.
        """
        path = self.directory / f"{cache_key(data, evaluator)}.json"
        found = self._read(path)
        if found is None:
            found = compute(data, evaluator)
            self._write(path, found)
        return found

    def _read(self, path: Path) -> Importances | None:
        """The answer in ``path``; None when there is none, or it cannot be read (computed
        again then, and rewritten)."""
        try:
            return importances_from_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.debug("Ignoring the unreadable cached importances %s: %s", path, e)
            return None

    def _write(self, path: Path, found: Importances) -> None:
        """Write ``found`` to ``path`` whole (a temp file renamed), then prune; a directory that
        cannot be written is said in a warning, and the next call computes again."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(dataclasses.asdict(found), f)
            os.replace(temp, path)
            self._prune()
        except OSError as e:
            log.warning(
                "Could not cache the importances in %s (%s); the next call computes them again. "
                "Set XDG_CACHE_HOME to a writable directory to keep them.",
                self.directory,
                e,
            )

    def _prune(self) -> None:
        """Delete the oldest files beyond :data:`MAX_FILES`."""
        files = sorted(self.directory.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in files[:-MAX_FILES]:
            old.unlink(missing_ok=True)


def cache_key(data: ImportanceInput, evaluator: str) -> str:
    """The SHA-256 of everything the importances of ``data`` by ``evaluator`` depend on."""
    inputs = {
        "format": CACHE_FORMAT,
        "versions": [_version("airflow-trials"), _version("optuna")],
        "evaluator": evaluator,
        "fanova": [FANOVA_TREES, FANOVA_MAX_DEPTH, FANOVA_SEED],
        "data": dataclasses.asdict(data),
    }
    text = json.dumps(inputs, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def importances_from_json(document: dict[str, Any]) -> Importances:
    """The :class:`Importances` that ``dataclasses.asdict`` turned into ``document``."""
    params = [
        ParamImportance(
            name=p["name"],
            importance=p["importance"],
            spec=ParamSpec(**{**p["spec"], "choices": tuple(p["spec"]["choices"])}),
        )
        for p in document["params"]
    ]
    return Importances(**{**document, "params": params})


def _version(distribution: str) -> str:
    """The installed version of ``distribution``, without importing it."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
