"""Windows nobody asked for: closed between the reset and the policy's first action, recorded.

After a reset and the task's setup, once the screen is ready, the desktop's windows are the
ones the setup produced. A window that appears after that and before the policy's first action
(an "updates available" dialog, a crash reporter) cannot be the policy's doing; left open it
takes the focus and the policy's first keystrokes go into it (status ok, reward 0, nothing
said). :class:`PopupGuard` checks twice, closes what it finds and records it in
``reset_facts["unexpected_windows"]`` (the engine puts it in ``record.reset``):

- ``handout``: before the first screenshot goes to the policy (after
  ``Waits.settle_after_reset_s`` of watching, default 0);
- ``first_action``: before the policy's first action runs: a popup that showed up while the
  policy decided, on a screen it never saw.

Never later: a window that appears after the policy acted may be its doing and is left alone.
A window that survives being closed and its X client killed raises
``DesktopError(kind="unexpected_window")``: retried on a restarted desktop, never scored as the
policy's failure.

A window the backend marks ``"launched"`` belongs to an app the task's setup launched (the
local desktop server knows each window's process and what it launched since the reset): it
is the app, never a popup, even when it maps after the ready wait (GIMP's main window, seconds
after its splash).

Backends give the two primitives: :meth:`PopupGuard._list_windows` and
:meth:`PopupGuard._close_windows`. :class:`WmctrlWindows` implements them over OSWorld's base
API (``wmctrl``/``xkill`` run through ``/execute``; OSWorld's VM server uses wmctrl itself).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import DesktopError
from .base import Wait

log = logging.getLogger("legato_pipelines.desktops.popups")

CLOSE_GRACE_S = 1.0  # seconds a window may take to close when asked, before its client is killed
POLL_S = 0.05


class PopupGuard:
    """Mixin of a desktop (before :class:`~legato_pipelines.desktops.base.WaitsByMode` in the
    bases): window baseline at the end of ``wait_after_reset``, checks in ``observe`` /
    ``act`` through :meth:`_guard_handout` and :meth:`_guard_first_action`. ``reset`` must
    call :meth:`_guard_reset` first."""

    name: str
    config: Any  # DesktopConfig
    reset_facts: dict[str, Any]

    async def _list_windows(self) -> list[dict[str, Any]] | None:
        """The managed top-level windows, each ``{"id", "title", "class"}`` and optionally
        ``"launched"`` (True: an app the setup launched owns it, it is not a popup); ``None``
        when the desktop cannot list them (the guard is off then)."""
        raise NotImplementedError

    async def _close_windows(self, ids: list[Any]) -> dict[Any, str]:
        """Close windows ``ids`` (asked, then their client killed); ``{id: "closed" |
        "killed" | "open" | "gone"}``."""
        raise NotImplementedError

    def _guard_reset(self) -> None:
        self.reset_facts = {}
        self._window_baseline: set[Any] | None = None
        self._window_checks: list[str] = []

    async def wait_after_reset(self) -> Wait:
        """The ready wait (the next class's), then the windows the setup produced are
        recorded; ``settle_after_reset_s`` seconds more watching before the hand-out."""
        wait = await super().wait_after_reset()  # type: ignore[misc]
        windows = await self._list_windows()
        if windows is None:
            self._window_checks = []
            return wait
        self._window_baseline = {w["id"] for w in windows}
        self._window_checks = ["handout", "first_action"]
        settle = self.config.waits.settle_after_reset_s
        if settle > 0:
            await asyncio.sleep(settle)
            wait = Wait(wait.wait_s + settle, wait.ready_s, wait.timed_out)
        return wait

    async def _guard_handout(self) -> None:
        """Call first thing in ``observe``."""
        if "handout" in getattr(self, "_window_checks", ()):
            await self._check_windows("handout")

    async def _guard_first_action(self) -> None:
        """Call first thing in ``act``."""
        if "first_action" in getattr(self, "_window_checks", ()):
            await self._check_windows("first_action")

    async def _check_windows(self, when: str) -> None:
        self._window_checks = [] if when == "first_action" else ["first_action"]
        windows = await self._list_windows()
        baseline = self._window_baseline or set()
        new = [w for w in windows or () if w["id"] not in baseline and not w.get("launched")]
        if not new:
            return
        outcome = await self._close_windows([w["id"] for w in new])
        found = [
            {
                "title": w.get("title"),
                "wm_class": w.get("class"),
                "when": when,
                "outcome": outcome.get(w["id"], "open"),
            }
            for w in new
        ]
        self.reset_facts.setdefault("unexpected_windows", []).extend(found)
        survivors = [f for f in found if f["outcome"] == "open"]
        if survivors:  # the engine's recover() restarts / reverts the desktop
            raise DesktopError(
                f"{self.name}: an unexpected window could not be closed "
                f"({survivors[0]['wm_class']} {survivors[0]['title']!r}, found at {when})",
                kind="unexpected_window",
            )
        await self._wait("action")  # type: ignore[attr-defined]  # the screen under it repaints


async def wait_until_gone(
    list_ids: Callable[[], Awaitable[set[Any]]], ids: list[Any], grace_s: float
) -> set[Any]:
    """Poll ``list_ids()`` until none of ``ids`` is listed or ``grace_s`` seconds passed;
    the ids still listed."""
    deadline = time.monotonic() + grace_s
    while True:
        left = set(ids) & await list_ids()
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(POLL_S)


class WmctrlWindows:
    """:meth:`PopupGuard._list_windows` / ``_close_windows`` over OSWorld's base API:
    ``wmctrl -lx`` to list, ``wmctrl -ic`` to close, ``xkill -id`` for a window that stays.
    ``execute(argv) -> {returncode, output, ...}`` runs a command on the desktop."""

    name: str

    def __init__(self, execute: Callable[[list[str]], Awaitable[dict[str, Any]]]):
        self._execute = execute
        self._wmctrl_missing = False

    async def list(self) -> list[dict[str, Any]] | None:
        if self._wmctrl_missing:
            return None
        out = await self._execute(["wmctrl", "-lx"])
        if out.get("returncode") != 0:
            self._wmctrl_missing = True
            log.warning(
                "wmctrl -lx failed on the desktop (%s): unexpected windows are not checked",
                ((out.get("error") or "") + (out.get("output") or "")).strip()[-200:],
            )
            return None
        return parse_wmctrl(out.get("output") or "")

    async def close(self, ids: list[str]) -> dict[str, str]:
        async def listed() -> set[str]:
            return {w["id"] for w in await self.list() or ()}

        now = await listed()
        outcome = {wid: "gone" for wid in ids if wid not in now}
        asked = [wid for wid in ids if wid in now]
        for wid in asked:
            await self._execute(["wmctrl", "-ic", wid])
        stubborn = await wait_until_gone(listed, asked, CLOSE_GRACE_S)
        outcome |= {wid: "closed" for wid in asked if wid not in stubborn}
        for wid in stubborn:
            await self._execute(["xkill", "-id", wid])
        survivors = await wait_until_gone(listed, list(stubborn), CLOSE_GRACE_S)
        outcome |= {wid: "open" if wid in survivors else "killed" for wid in stubborn}
        return outcome


def parse_wmctrl(output: str) -> list[dict[str, Any]]:
    """``wmctrl -lx`` lines (``0x02000003  0 xterm.XTerm  host Title words``) as
    ``[{"id": "0x02000003", "title", "class"}]``."""
    windows = []
    for line in output.splitlines():
        parts = line.split(None, 4)
        if len(parts) < 3 or not parts[0].startswith("0x"):
            continue
        wm_class = parts[2].split(".", 1)[-1]
        title = parts[4] if len(parts) > 4 else ""
        windows.append({"id": parts[0], "title": title, "class": wm_class})
    return windows
