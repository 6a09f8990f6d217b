"""The worker's calls to its VM's server (OSWorld's in-VM server, or a project desktop server as
provider ``local``'s "VM"): the token on DesktopEnv's own ``requests`` calls, a liveness
probe with a short timeout, and a JSON POST.

Loaded under the OSWorld interpreter as a module of the package ``legato_osworld`` that
``worker.py`` makes of this directory (:func:`worker.as_package`): standard library and
``desktop_env`` only, its siblings by relative import.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from .worker_process import WorkerError

PROBE_TIMEOUT_S = 5.0


def add_vm_token(base_url: str, token: str) -> None:
    """Send ``Authorization: Bearer <token>`` on every ``requests`` call to ``base_url``.

    DesktopEnv's controllers call OSWorld's in-VM server with plain ``requests``; a project
    local desktop server wants its token. Only requests to ``base_url`` carry it.
    """
    import requests.sessions

    original = requests.sessions.Session.request
    if getattr(original, "_legato_token", False):
        return

    def request(self, method, url, *args, headers=None, **kwargs):
        if isinstance(url, str) and url.startswith(base_url):
            headers = dict(headers or {})
            headers.setdefault("Authorization", f"Bearer {token}")
        return original(self, method, url, *args, headers=headers, **kwargs)

    request._legato_token = True
    requests.sessions.Session.request = request


def http_probe(url: str, token: str | None, timeout: float = PROBE_TIMEOUT_S) -> None:
    """GET ``url`` once; raise ``WorkerError("vm")`` unless it answers 200 within ``timeout`` s."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise WorkerError("vm", f"the VM server answered {exc.code} to GET {url}") from None
    except (OSError, urllib.error.URLError) as exc:
        raise WorkerError("vm", f"the VM server does not answer GET {url}: {exc}") from None


def http_post_json(url: str, body: dict, token: str | None, timeout: float) -> dict:
    """POST JSON, return the JSON answer; ``WorkerError("vm")`` on any failure."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode(errors="replace")
        raise WorkerError("vm", f"POST {url}: HTTP {exc.code}: {detail}") from None
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise WorkerError("vm", f"POST {url}: {exc}") from None
