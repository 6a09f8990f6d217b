"""DesktopEnv provider ``local``: the "VM" is a project local desktop server, by URL.

Worker side (loaded by ``worker.py`` under the OSWorld interpreter): standard library and
``desktop_env`` only. The local desktop server speaks OSWorld's in-VM API (``/screenshot``,
``/execute``, ``/setup/*``, ``/terminal``, ...) plus ``/legato/`` routes, on loopback with a
token; so the real ``DesktopEnv``, ``SetupController`` and OSWorld's evaluators run unchanged
against a real X11 desktop, with no Docker engine and no VM image.

Lifecycle mapping (docs/osworld.md §1, §8):
  start_emulator        wait until ``/legato/health`` says the display is up (the backend
                        started the server: it is the hypervisor here)
  get_ip_address        ``"127.0.0.1:<server>:<cdp>:<vnc>:<vlc>"``: exactly the five fields
                        DesktopEnv parses (the other ports are informational)
  revert_to_snapshot    ``POST /legato/reset {"full": true}``: a fresh display, the clean HOME
                        (the local analogue of a snapshot revert); returns the same path
  fast_reset            ``POST /legato/reset {"full": false}``: kill the task's processes,
                        verify none survived, restore the clean HOME (project extension)
  stop_emulator         nothing: the backend owns and stops the server process
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from desktop_env.providers.base import Provider, VMManager

HEALTH_TIMEOUT_S = 30.0
RESET_TIMEOUT_S = 90.0


class LocalProviderError(RuntimeError):
    """The local desktop server did not answer or refused a request (the message says which)."""


class LocalProvider(Provider):
    """A DesktopEnv provider over one local desktop server at ``url`` (token sent as Bearer)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        chromium: int = 9222,
        vnc: int = 8006,
        vlc: int = 8080,
    ):
        super().__init__(region=None)
        self.url = url.rstrip("/")
        self.token = token
        parts = urlsplit(self.url)
        if not parts.hostname or not parts.port:
            raise LocalProviderError(f"vm_url must be http://host:port, got {url!r}")
        self.host, self.port = parts.hostname, parts.port
        self.ports = (chromium, vnc, vlc)

    def _call(self, method: str, path: str, body: dict | None, timeout: float) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise LocalProviderError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        except (OSError, urllib.error.URLError) as exc:
            raise LocalProviderError(f"{method} {path}: {exc}") from None

    def start_emulator(self, path_to_vm: str, headless: bool, os_type: str = "Ubuntu") -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                if self._call("GET", "/legato/health", None, 5.0).get("ok"):
                    return
                last = "the display is not up"
            except LocalProviderError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise LocalProviderError(
            f"the local desktop at {self.url} is not up after {HEALTH_TIMEOUT_S:g} s: {last}"
        )

    def get_ip_address(self, path_to_vm: str) -> str:
        return ":".join(str(p) for p in (self.host, self.port, *self.ports))

    def save_state(self, path_to_vm: str, snapshot_name: str) -> None:
        raise NotImplementedError("the local desktop has one snapshot, its clean baseline")

    def revert_to_snapshot(self, path_to_vm: str, snapshot_name: str) -> str:
        self._call("POST", "/legato/reset", {"full": True}, RESET_TIMEOUT_S)
        return path_to_vm

    def fast_reset(self) -> dict:
        """``{kind: fast|full, reset_s, ...}``: the server falls back to full when fast fails."""
        return self._call("POST", "/legato/reset", {"full": False}, RESET_TIMEOUT_S)

    def stop_emulator(self, path_to_vm: str, *args, **kwargs) -> None:
        return None


class LocalVMManager(VMManager):
    """The one "VM" is the server URL; DesktopEnv only calls ``get_vm_path``
    (docs/osworld.md §8)."""

    def __init__(self, url: str):
        self.url = url

    def initialize_registry(self, **kwargs):
        return None

    def add_vm(self, vm_path, **kwargs):
        return None

    def delete_vm(self, vm_path, **kwargs):
        return None

    def occupy_vm(self, vm_path, pid, **kwargs):
        return None

    def list_free_vms(self, **kwargs):
        return [self.url]

    def check_and_clean(self, **kwargs):
        return None

    def get_vm_path(self, **kwargs):
        return self.url
