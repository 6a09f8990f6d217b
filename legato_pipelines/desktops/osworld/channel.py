"""The ``osworld`` backend's channel to its worker: one subprocess per desktop, JSON lines.

The worker (``worker.py``) runs under the OSWorld interpreter; this side is asyncio only:
every request has a deadline; a worker that misses one is stopped (SIGTERM: it closes its VM;
SIGKILL after a grace period) and the call raises
:class:`~legato_pipelines.errors.DesktopError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

from ...errors import ConfigError, DesktopError

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
PROTOCOL_LINE_LIMIT = 64 * 2**20  # bytes: a base64 screenshot fits on one line
STOP_GRACE_S = 30.0  # a worker closing a docker VM needs a while
#: What a missed deadline counts as, per request.
DEADLINE_KIND = {
    "start": "vm",
    "reset": "setup",
    "setup": "setup",
    "observe": "vm",
    "step": "vm",
    "evaluate": "evaluator",
    "close": "vm",
    "plan": "transport",
}


class WorkerProcess:
    """One worker subprocess and its JSON-lines channel.

    ``python``: the OSWorld interpreter; ``env``: the worker's whole environment; ``cwd``: its
    working directory. :meth:`call` sends one request and waits at most ``timeout`` seconds.
    """

    def __init__(
        self,
        python: str,
        *,
        env: dict[str, str],
        cwd: str,
        name: str = "osworld",
        log_path: str | None = None,
    ):
        self.python, self.env, self.cwd, self.name = python, env, cwd, name
        self.log_path = log_path
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._broken = False  # a call was cancelled mid-way: the channel is out of step

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and not self._broken

    async def start(self) -> None:
        """Spawn the worker (``<python> -I worker.py``; isolated mode: no user site, no PYTHON* env).

        Its stderr (DesktopEnv's logging and prints) is appended to ``log_path`` when given.
        """
        os.makedirs(self.cwd, exist_ok=True)
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            self._proc = await asyncio.create_subprocess_exec(
                self.python,
                "-I",
                str(WORKER_SCRIPT),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=self.env,
                cwd=self.cwd,
                stderr=log,
                limit=PROTOCOL_LINE_LIMIT,
                start_new_session=True,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot run the OSWorld interpreter {self.python!r}: {exc} "
                "(fix: legato osworld install, or --osworld-python PATH)"
            ) from None
        finally:
            if log is not None:
                log.close()  # the child has its own descriptor

    async def call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send ``{op, **fields}``; return the worker's ``result``.

        Raises ``DesktopError`` with the worker's failure kind, with kind ``transport`` when the
        worker is gone, or with the op's kind (:data:`DEADLINE_KIND`) when ``timeout`` seconds
        pass (the worker is stopped then: it may be stuck in one of DesktopEnv's sleeps).
        """
        async with self._lock:
            if not self.alive():
                raise DesktopError(
                    f"{self.name}: the OSWorld worker is not running", kind="transport"
                )
            proc = self._proc  # stop() may run meanwhile and drop self._proc
            self._next_id += 1
            rid = self._next_id
            line = json.dumps({"id": rid, "op": op, **fields}).encode() + b"\n"
            try:
                proc.stdin.write(line)
                await proc.stdin.drain()
                raw = await asyncio.wait_for(proc.stdout.readline(), timeout)
            except asyncio.CancelledError:
                # the caller gave up (e.g. the engine's own eval deadline): the answer would
                # arrive for the next request, so this worker is done; stop() reaps it
                self._broken = True
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                    proc.send_signal(signal.SIGCONT)
                raise
            except TimeoutError:
                await self.stop(grace=5.0)
                raise DesktopError(
                    f"{self.name}: OSWorld worker {op} gave no answer within {timeout:g} s (worker stopped)",
                    kind=DEADLINE_KIND.get(op, "vm"),
                ) from None
            except (ConnectionError, BrokenPipeError, ValueError) as exc:
                raise DesktopError(
                    f"{self.name}: OSWorld worker channel broke during {op}: {exc}",
                    kind="transport",
                ) from None
            if not raw:
                code = await proc.wait()
                raise DesktopError(
                    f"{self.name}: the OSWorld worker exited ({code}) during {op} (log: {self.log_path or 'stderr'})",
                    kind="transport",
                )
            answer = json.loads(raw)
            if answer.get("id") != rid:
                await self.stop(grace=5.0)
                raise DesktopError(
                    f"{self.name}: OSWorld worker answered request {answer.get('id')} to {rid}",
                    kind="transport",
                )
            if not answer.get("ok"):
                error = answer.get("error") or {}
                kind = error.get("kind") or "vm"
                raise DesktopError(
                    f"{self.name}: {op}: {error.get('message', 'failed')}",
                    kind="transport" if kind == "protocol" else kind,
                )
            return answer.get("result") or {}

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM (the worker closes its DesktopEnv), SIGKILL after ``grace`` seconds."""
        proc, self._proc = self._proc, None
        self._broken = False
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGCONT)  # a stopped worker gets to handle the SIGTERM
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            proc.kill()
            await proc.wait()
