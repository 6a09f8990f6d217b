"""What this host knows about the model servers it loads checkpoints into: a lock per server for
full weights, leases on the LoRA adapters live runs call, and the fingerprint each adapter was
loaded with.

A model server is shared by every run that calls it (two Dagster runs at once, a ``legato
collect`` beside them), and loading changes what all of them get. Three files per server, in
``<state dir>/<host_port>-<hash of the URL>/``:

``weights.lock``     a ``flock`` lock. A ``weights`` run holds it exclusively from before it
                     loads its weights until its collection ends: full weights are one version at
                     a time per server, so a second ``weights`` run waits for it (at most
                     ``LoadSpec.wait`` seconds, then fails naming the run that holds it).
``leases/``          one file per run calling an adapter (``<adapter>@<pid>-<token>``, holding
                     the pid, host and version): an adapter with a live lease is never unloaded
                     by another run's ``keep`` limit. A lease of a process that is gone (same
                     host, pid not alive) or older than :data:`FOREIGN_LEASE_S` (another host)
                     is stale and removed when seen.
``adapters.json``    ``{adapter: {"path", "fingerprint"}}`` as last loaded from here: an adapter
                     already served from the same folder is kept only when the folder's
                     fingerprint is the one it was loaded with (a folder rewritten in place is
                     loaded again).

The state dir is ``LEGATO_LOAD_STATE`` when set, else ``$DAGSTER_HOME/.legato/servers`` when
``DAGSTER_HOME`` is set, else ``~/.cache/legato/servers``. Locks and leases are per host: runs
on several hosts that share one server need this directory on a shared filesystem that
supports ``flock`` (NFSv4 does), or one server per worker host.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from ..errors import LoadError

log = logging.getLogger(__name__)

STATE_ENV = "LEGATO_LOAD_STATE"
FOREIGN_LEASE_S = 24 * 3600
"""[s] a lease written on another host counts as live for this long."""
POLL_S = 0.25
"""[s] how often a waiting run tries the weights lock again."""


def state_dir() -> Path:
    """Where server state lives (module doc)."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    if os.environ.get("DAGSTER_HOME"):
        return Path(os.environ["DAGSTER_HOME"]) / ".legato" / "servers"
    return Path.home() / ".cache" / "legato" / "servers"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "_"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


class ServerState:
    """The state files of one model server (its root URL, e.g. ``http://127.0.0.1:8000``)."""

    def __init__(self, root_url: str, directory: str | Path | None = None):
        self.url = root_url.rstrip("/")
        key = hashlib.sha256(self.url.encode()).hexdigest()[:12]
        host = re.sub(r"^[a-z]+://", "", self.url)
        self.dir = Path(directory or state_dir()) / f"{_safe(host)}-{key}"

    def _mkdir(self, *parts: str) -> Path:
        path = self.dir.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- the weights lock -------------------------------------------------------------------

    async def lock_weights(self, holder: dict[str, Any], wait: float) -> WeightsLock:
        """Hold the server's weights lock (exclusive; module doc), waiting at most ``wait``
        seconds for the run that holds it. Raises ``LoadError`` naming that run and
        ``--load-wait`` when it is still held then."""
        path = self._mkdir() / "weights.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        told = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    other = _read_holder(path)
                    if time.monotonic() >= deadline:
                        raise LoadError(
                            f"the policy server {self.url} is loading or serving full weights for "
                            f"another run ({_describe(other)}) and still was after {wait:g} s: "
                            "full weights are one version at a time per server (fix: wait for "
                            "that run, --load-wait longer, or another server for this run)"
                        ) from None
                    if not told:
                        log.info(
                            "waiting for %s: its full weights serve another run (%s)",
                            self.url,
                            _describe(other),
                        )
                        told = True
                    await asyncio.sleep(POLL_S)
            os.ftruncate(fd, 0)
            os.pwrite(fd, orjson.dumps(holder), 0)
        except BaseException:
            os.close(fd)
            raise
        return WeightsLock(fd, path)

    # -- adapter leases ---------------------------------------------------------------------

    def lease(self, adapter: str, holder: dict[str, Any]) -> Path:
        """A lease on ``adapter`` for this run (a file; remove it with :func:`release_path`)."""
        leases = self._mkdir("leases")
        path = leases / f"{_safe(adapter)}@{os.getpid()}-{uuid.uuid4().hex[:8]}"
        body = {"adapter": adapter, "pid": os.getpid(), "host": socket.gethostname(), **holder}
        path.write_bytes(orjson.dumps(body))
        return path

    def leased(self, adapter: str, *, mine: Path | None = None) -> list[dict[str, Any]]:
        """The live leases on ``adapter`` other than ``mine``; stale ones are removed."""
        leases = self.dir / "leases"
        if not leases.is_dir():
            return []
        out = []
        for path in leases.glob(f"{glob_escape(_safe(adapter))}@*"):
            if mine is not None and path == mine:
                continue
            try:
                body = orjson.loads(path.read_bytes())
                age = time.time() - path.stat().st_mtime
            except (OSError, orjson.JSONDecodeError):
                continue
            if body.get("adapter") != adapter:
                continue
            if body.get("host") == socket.gethostname():
                live = isinstance(body.get("pid"), int) and _alive(body["pid"])
            else:
                live = age < FOREIGN_LEASE_S
            if live:
                out.append(body)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        return out

    # -- adapters loaded from here ----------------------------------------------------------

    def _adapters_file(self) -> Path:
        return self.dir / "adapters.json"

    def loaded(self, adapter: str) -> dict[str, Any] | None:
        """``{"path", "fingerprint"}`` of ``adapter`` as last loaded from this host, or
        ``None`` when unknown."""
        try:
            data = orjson.loads(self._adapters_file().read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        entry = data.get(adapter) if isinstance(data, dict) else None
        return entry if isinstance(entry, dict) else None

    def remember(self, adapter: str, path: str | None, digest: str | None) -> None:
        """Note that ``adapter`` was loaded from ``path`` with fingerprint ``digest`` (``path``
        ``None``: it was unloaded)."""
        self._mkdir()
        target = self._adapters_file()
        with open(self.dir / "adapters.lock", "a+b") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                data = orjson.loads(target.read_bytes())
                if not isinstance(data, dict):
                    data = {}
            except (OSError, orjson.JSONDecodeError):
                data = {}
            if path is None:
                data.pop(adapter, None)
            else:
                data[adapter] = {"path": path, "fingerprint": digest}
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_SORT_KEYS))
            tmp.replace(target)


class WeightsLock:
    """A held weights lock; :meth:`release` (idempotent) lets the next run load."""

    def __init__(self, fd: int, path: Path):
        self.fd: int | None = fd
        self.path = path

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def release_path(path: Path | None) -> None:
    """Remove a lease file (missing is fine)."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _read_holder(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    parts = [f"version {holder['version']!r}" if holder.get("version") else None]
    if holder.get("checkpoint"):
        parts.append(f"from {holder['checkpoint']}")
    if holder.get("pid"):
        parts.append(f"pid {holder['pid']} on {holder.get('host', '?')}")
    return ", ".join(p for p in parts if p)
