"""A real DesktopController over a local directory: commands run as subprocesses in a temp HOME.

No display: ``launch`` starts the process for real, ``open_file`` checks the file exists, window
calls are recorded. Files and commands are real, so getters, metrics and setup semantics are
exercised end to end without Xvfb. ``calls`` lists every controller call in order.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from legato_pipelines.errors import DesktopError


class HomeController:
    """DesktopController whose "desktop" is ``home`` on this machine (OSWorld server semantics)."""

    def __init__(self, home: Path, screen: tuple[int, int] = (1280, 720)):
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.screen = screen
        self.calls: list[tuple[str, Any]] = []
        self.launched: list[subprocess.Popen] = []
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
        }

    def _path(self, path: str) -> Path:
        path = str(path)
        if path.startswith("~/") or path == "~":
            return self.home / path[2:]
        p = Path(path)
        return p if p.is_absolute() else self.home / p

    def _argv(self, command: list[str] | str, shell: bool) -> list[str] | str:
        # OSWorld server: "~/" expanded; a string without shell is split with shlex.
        if isinstance(command, str):
            command = command.replace("~/", f"{self.home}/")
            return command if shell else shlex.split(command)
        argv = [
            str(c).replace("~/", f"{self.home}/") if str(c).startswith("~/") else str(c)
            for c in command
        ]
        return " ".join(argv) if shell else argv

    async def execute(self, command, shell: bool = False, timeout: float = 120.0) -> dict[str, Any]:
        self.calls.append(("execute", command))
        argv = self._argv(command, shell)
        try:
            if shell:
                proc = await asyncio.create_subprocess_shell(
                    argv,
                    cwd=self.home,
                    env=self.env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            else:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=self.home,
                    env=self.env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
        except (FileNotFoundError, PermissionError) as exc:
            return {"status": "error", "message": str(exc)}
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return {"status": "error", "message": f"timed out after {timeout} s"}
        return {
            "status": "success",
            "output": out.decode(),
            "error": err.decode(),
            "returncode": proc.returncode,
        }

    async def launch(self, command, shell: bool = False) -> None:
        self.calls.append(("launch", command))
        argv = self._argv(command, shell)
        try:
            proc = subprocess.Popen(
                argv,
                shell=shell,
                cwd=self.home,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except (FileNotFoundError, PermissionError) as exc:
            raise DesktopError(f"launch {command!r}: {exc}", kind="setup") from exc
        self.launched.append(proc)

    async def open_file(self, path: str) -> None:
        self.calls.append(("open_file", path))
        if not self._path(path).exists():
            raise DesktopError(f"open_file: {path} does not exist", kind="setup")

    async def activate_window(
        self, window_name: str, strict: bool = False, by_class: bool = False
    ) -> None:
        self.calls.append(("activate_window", window_name))

    async def close_window(
        self, window_name: str, strict: bool = False, by_class: bool = False
    ) -> None:
        self.calls.append(("close_window", window_name))

    async def upload(self, path: str, data: bytes) -> None:
        self.calls.append(("upload", path))
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def file(self, path: str) -> bytes | None:
        self.calls.append(("file", path))
        target = self._path(path)
        return target.read_bytes() if target.is_file() else None

    async def screen_size(self) -> tuple[int, int]:
        return self.screen

    def close(self) -> None:
        for proc in self.launched:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
