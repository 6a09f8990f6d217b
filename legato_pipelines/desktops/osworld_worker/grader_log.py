"""The part of a grader's log that one attempt wrote, kept with the run rather than the batch.

A grader that is a process of its own (OSWorld's code in an osworld worker: the local
backend's grader, the osworld backend's DesktopEnv) writes its logging and prints to a log
file in a work directory of the batch. The local backend's is a temporary directory removed
with the batch; the osworld backend's log holds every attempt of a desktop, one after the
other. :class:`AttemptLog` notes where the current attempt's part of each such file begins
(:meth:`~AttemptLog.mark`, at its setup and when another worker takes over) and reads those
parts back once the attempt is over (:meth:`~AttemptLog.take`); the engine stores them in the
run directory as ``grader-logs/<rollout_id>.log`` and the record names that path
(``grader_log``; ``store/rundir.py``), so the log survives the batch and is reachable from
the attempt's record.
"""

from __future__ import annotations

import os

#: The most of one attempt's grader log kept [bytes]: its end, where an error is.
GRADER_LOG_MAX_BYTES = 2 * 2**20


class AttemptLog:
    """Byte ranges of log files that belong to the current attempt, in the order marked."""

    def __init__(self) -> None:
        self._parts: list[tuple[str, int]] = []  # (path, offset where the attempt's part begins)

    def start(self, path: str | os.PathLike | None) -> None:
        """A new attempt: forget earlier marks, then :meth:`mark` ``path``."""
        self._parts = []
        self.mark(path)

    def mark(self, path: str | os.PathLike | None) -> None:
        """The attempt's part of the log file ``path`` starts at its current end (0 when it does
        not exist yet). ``None`` (a worker logging nowhere) and a path already marked are
        ignored."""
        if path is None or any(p == os.fspath(path) for p, _ in self._parts):
            return
        try:
            offset = os.path.getsize(path)
        except OSError:
            offset = 0
        self._parts.append((os.fspath(path), offset))

    @property
    def paths(self) -> list[str]:
        """The files marked since the last :meth:`take`, in mark order."""
        return [path for path, _ in self._parts]

    def take(self, limit: int = GRADER_LOG_MAX_BYTES) -> bytes | None:
        """What was written to the marked files since their marks, concatenated in mark order
        (each file's part under a ``==> <file name> <==`` line when there are several), at most
        the last ``limit`` bytes (a first line says how many were cut); then the marks are
        forgotten. ``None`` when nothing was marked or nothing was written. A file that
        cannot be read is skipped."""
        parts, self._parts = self._parts, []
        chunks: list[bytes] = []
        for path, offset in parts:
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except OSError:
                continue
            if data:
                head = f"==> {os.path.basename(path)} <==\n".encode() if len(parts) > 1 else b""
                chunks.append(head + data)
        if not chunks:
            return None
        text = b"".join(chunks)
        if len(text) > limit:
            cut = len(text) - limit
            text = f"[legato: the first {cut} bytes of this log were cut]\n".encode() + text[cut:]
        return text
