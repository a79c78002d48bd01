"""Reading a trial's captured stdout/stderr in bounded pieces: the new lines since a byte offset.

A poll reads only what was written since the watcher's offset, and at most ``max_bytes`` of it
(the newest), so polling a trial that prints a lot never re-reads its whole file. Lines beyond
the bounds are counted, not returned: the caller says so and where the whole file is.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

STREAMS = ("stdout", "stderr")
# Per stream and poll: what one poll brings back at most.
MAX_LINES_PER_POLL = 100
MAX_BYTES_PER_POLL = 32 * 1024
# One line longer than this (a progress bar redrawn with \r, say) is cut.
MAX_LINE_CHARS = 1000


@dataclass(frozen=True)
class OutputChunk:
    """The new output of one stream.

    :param path: the file read (on the trial's node).
    :param lines: the new complete lines, newest last, without their line ends.
    :param offset: where the next read starts (bytes from the start of the file).
    :param skipped_bytes: bytes left out before ``lines`` (more than one poll's bound was new).
    :param skipped_lines: lines left out before ``lines``, besides those bytes.
    """

    path: str
    lines: list[str] = field(default_factory=list)
    offset: int = 0
    skipped_bytes: int = 0
    skipped_lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_new_output(
    path: str,
    offset: int,
    *,
    final: bool = False,
    max_lines: int = MAX_LINES_PER_POLL,
    max_bytes: int = MAX_BYTES_PER_POLL,
    file: BinaryIO | None = None,
) -> OutputChunk:
    """The complete lines written to ``path`` after byte ``offset``, at most the newest
    ``max_lines`` within the newest ``max_bytes``.

    An unfinished last line waits for the next read, unless ``final`` (the writer is done) or it
    alone fills ``max_bytes``. A file shorter than ``offset`` (replaced) is read from its start;
    a missing one has no output yet. ``file``, when given, is ``path`` already opened (by a
    caller that checked what it opened): it is read instead, and left open.
    """
    if file is None:
        try:
            with open(path, "rb") as f:
                return _read_new(f, path, offset, final, max_lines, max_bytes)
        except FileNotFoundError:
            return OutputChunk(path, offset=offset)
    return _read_new(file, path, offset, final, max_lines, max_bytes)


def _read_new(
    f: BinaryIO, path: str, offset: int, final: bool, max_lines: int, max_bytes: int
) -> OutputChunk:
    size = os.fstat(f.fileno()).st_size
    start = offset if 0 <= offset <= size else 0
    skipped_bytes = 0
    if size - start > max_bytes:
        skipped_bytes = size - max_bytes - start
        start = size - max_bytes
    # One byte more when skipping: whether the read starts at a line's beginning.
    f.seek(start - 1 if skipped_bytes else start)
    data = f.read(size - start + (1 if skipped_bytes else 0))
    if skipped_bytes:
        # A line starts after a newline; from inside one, start at the next whole line.
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            skipped_bytes += newline
            start += newline
            data = data[newline + 1 :]
        else:
            data = data[1:]
    if not (final or len(data) >= max_bytes):
        data = data[: data.rfind(b"\n") + 1]  # complete lines only: rfind is -1 without one
    lines = [_cut(line) for line in data.decode("utf-8", errors="replace").splitlines()]
    skipped_lines = max(0, len(lines) - max_lines)
    return OutputChunk(path, lines[skipped_lines:], start + len(data), skipped_bytes, skipped_lines)


def read_tail(
    path: str, max_lines: int = 200, max_bytes: int = 64 * 1024, file: BinaryIO | None = None
) -> OutputChunk:
    """The last ``max_lines`` lines of ``path`` within its last ``max_bytes`` (a finished file);
    read from ``file`` when given (see :func:`read_new_output`)."""
    return read_new_output(path, 0, final=True, max_lines=max_lines, max_bytes=max_bytes, file=file)


def _cut(line: str) -> str:
    return (
        line
        if len(line) <= MAX_LINE_CHARS
        else f"{line[:MAX_LINE_CHARS]}... ({len(line)} characters)"
    )


class LogCapture:
    """Points this process's stdout and stderr (file descriptors 1 and 2) at a trial's log files."""

    def __init__(self) -> None:
        self._saved: tuple[int, int] | None = None
        self.paths: dict[str, str] = {}
        # Where this trial's output starts in each file: a retry on the same node appends.
        self.start_offsets: dict[str, int] = {}

    def start(self, stdout_path: str, stderr_path: str) -> None:
        self.stop()
        os.makedirs(os.path.dirname(stdout_path), exist_ok=True)
        self.paths = dict(zip(STREAMS, (stdout_path, stderr_path), strict=True))
        self.start_offsets = {
            s: os.path.getsize(p) if os.path.exists(p) else 0 for s, p in self.paths.items()
        }
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        for fd, path in ((1, stdout_path), (2, stderr_path)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
            os.close(target)

    def flush(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()

    def stop(self) -> None:
        if self._saved is None:
            return
        self.flush()
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        self._saved = None
