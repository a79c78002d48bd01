"""Resolving ``"package.module:name"`` import paths, shared by trainables and ``sample_from``
domains."""

from __future__ import annotations

import importlib
from typing import Any


def split_import_path(path: Any) -> tuple[str, str] | None:
    """``(module, attribute)`` of an import path, or None when ``path`` is not of that form."""
    if not isinstance(path, str):
        return None
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    return (module_name, attr) if module_name and attr else None


def import_object(path: Any, what: str, error: type[Exception], hint: str) -> Any:
    """The object that ``"package.module:name"`` (or ``"package.module.name"``) names.

    :param path: the import path; ``name`` may be dotted (``"pkg.mod:Class.method"``).
    :param what: what the path is for, as messages name it (``"trainable"``).
    :param error: the exception class raised, chained from the ImportError or AttributeError.
    :param hint: where the module must be importable, appended to an import failure's message.
    """
    title = what[:1].upper() + what[1:]
    if not isinstance(path, str) or not path:
        raise error(f"{title} path must be a non-empty string, got {path!r}.")
    parts = split_import_path(path)
    if parts is None:
        raise error(f"{title} path {path!r} is not of the form 'package.module:name'.")
    module_name, attr = parts
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise error(
            f"Cannot import module {module_name!r} of {what} {path!r}: {e}. Check the spelling "
            f"and that the package is installed {hint}."
        ) from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise error(
                f"Module {module_name!r} has no attribute {attr!r} ({what} {path!r}); "
                f"check the name after the ':'."
            ) from e
    return obj
