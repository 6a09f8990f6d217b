"""What OSWorld-format setup steps and evaluators need from a desktop: its server's base API.

OSWorld's in-VM server (``desktop_env/server/main.py``, port 5000) and the project's local
desktop server speak the same routes, so one client type implements this protocol for both;
the task runtime (setup steps, getters, metrics) is written against it and runs on the
collector's side, as OSWorld's ``SetupController`` and evaluators do. The protocol lives with
the runtime: the desktop backends use ``osworld_format``, never the other way round.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

#: Seconds a command of ``/execute`` may run unless told otherwise: OSWorld's server's own
#: ``subprocess.run`` timeout. The one definition the server, its client and the setup steps use.
EXECUTE_TIMEOUT_S = 120.0
#: Response header of ``/setup/activate_window`` and ``/setup/close_window`` on the project's
#: desktop servers: ``true`` / ``false``, whether a window matched. OSWorld's server answers 200
#: whatever ``wmctrl`` found and sends no such header (nothing is known then).
WINDOW_FOUND_HEADER = "X-Legato-Window-Found"


def window_found(header: str | None) -> bool | None:
    """The :data:`WINDOW_FOUND_HEADER` value as ``True`` / ``False``; ``None`` when absent or
    anything else (a server that does not say)."""
    value = (header or "").strip().lower()
    return True if value == "true" else False if value == "false" else None


@runtime_checkable
class DesktopController(Protocol):
    """Async access to one desktop's server. Methods raise ``DesktopError`` on transport failure."""

    async def execute(
        self, command: list[str] | str, shell: bool = False, timeout: float = EXECUTE_TIMEOUT_S
    ) -> dict[str, Any]:
        """``POST /execute``: run a command as the desktop's user in its HOME, wait for it.

        Returns ``{"status", "output", "error", "returncode"}`` (OSWorld's shape). ``~/`` is
        expanded; a string without ``shell`` is split with shlex (OSWorld semantics).
        """

    async def launch(self, command: list[str] | str, shell: bool = False) -> None:
        """``POST /setup/launch``: start a program and return without waiting for it."""

    async def open_file(self, path: str) -> None:
        """``POST /setup/open_file``: open with the default app; returns once its window shows."""

    async def activate_window(
        self, window_name: str, strict: bool = False, by_class: bool = False
    ) -> bool | None:
        """``POST /setup/activate_window`` (wmctrl ``-a`` semantics). Whether a window matched
        (:data:`WINDOW_FOUND_HEADER`), ``None`` when the server does not say."""

    async def close_window(
        self, window_name: str, strict: bool = False, by_class: bool = False
    ) -> bool | None:
        """``POST /setup/close_window`` (wmctrl ``-c`` semantics). Whether a window matched
        (:data:`WINDOW_FOUND_HEADER`), ``None`` when the server does not say."""

    async def upload(self, path: str, data: bytes) -> None:
        """``POST /setup/upload``: write ``data`` to ``path`` on the desktop (parents created)."""

    async def file(self, path: str) -> bytes | None:
        """``POST /file``: the file's bytes, or ``None`` when it does not exist (404)."""

    async def screen_size(self) -> tuple[int, int]:
        """``POST /screen_size``: (width, height) in pixels."""
