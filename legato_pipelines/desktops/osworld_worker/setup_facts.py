"""OSWorld's ``SetupController`` run step by step, its carry-on failures kept as facts.

Runs in the osworld backend's worker, under OSWorld's interpreter (standard library and
what ``desktop_env`` imports; loaded by file path, as ``provider_local.py``).

``SetupController.setup`` logs a refused ``launch`` or window step and a command that exits
non-zero, and carries on; the ``local`` backend (``osworld_format/setup.py``) keeps each of
these as a *fact* on the attempt's record (``reset.setup_failures``). :class:`SetupFacts`
gives the osworld backend the same facts, whatever the provider, by watching the answers the
controller gets from the VM server (its module's ``requests.post``), and runs the steps
itself (OSWorld's loop: the step's ``_<type>_setup`` method, any exception ends the setup)
so that it knows which step is running. One deliberate difference from OSWorld, as on the
``local`` backend: an ``open`` the server refuses (a missing file: 404) is a fact and the
setup carries on, where OSWorld's ``_open_setup`` raises.

Each fact is ``{step, type, exit_status, error}``: ``step`` the 0-based index, ``type`` the
step type, ``exit_status`` the command's status (``execute``; a ``launch`` that died at once:
the server's ``returncode``) or ``None``, ``error`` the stderr tail or the server's message
(at most :data:`FAILURE_TAIL_CHARS` characters).

With :attr:`SetupFacts.postconfig` (the evaluator's ``postconfig``, run by
``DesktopEnv.evaluate`` through the same controller) an ``activate_window`` /
``close_window`` that matched no window is a fact too, when the server says so: the
project's desktop servers answer 200 either way, as OSWorld's does, and add the header
:data:`WINDOW_FOUND_HEADER` (``false``: no match); OSWorld's own server says nothing, so
nothing is known there. The wording is ``osworld_format/setup.py``'s ``no_window_message``.
Each fact is also written to stderr, the worker's log (``grader_log`` on the record).
"""

from __future__ import annotations

import sys
import urllib.parse
from typing import Any

FAILURE_TAIL_CHARS = 500
#: ``osworld_format.controller.WINDOW_FOUND_HEADER`` (this module imports no project code)
WINDOW_FOUND_HEADER = "X-Legato-Window-Found"
#: Server routes whose refusal (HTTP >= 400) OSWorld logs and carries on after, by step type.
REFUSALS = {
    "/setup/launch": "launch",
    "/setup/open_file": "open",
    "/setup/activate_window": "activate_window",
    "/setup/close_window": "close_window",
}
#: The server's error ``kind`` values that are refusals (a fact); any other (``timeout``...)
#: is the desktop failing, and the setup stops as OSWorld's does.
REFUSAL_KINDS = (None, "setup")


class SetupFacts:
    """Runs setups for one worker; :attr:`failures` holds the facts of the last :meth:`run`.

    Args:
      setup_module  ``desktop_env.controllers.setup`` (its ``requests`` is wrapped once)
    """

    def __init__(self, setup_module) -> None:
        self.failures: list[dict[str, Any]] = []
        #: the evaluator's postconfig runs: a window step that matched no window is a fact
        self.postconfig = False
        self._step: tuple[int, str, dict] | None = None
        self._refused = False
        if not isinstance(setup_module.requests, _Watched):
            setup_module.requests = _Watched(setup_module.requests, self._answer)
        else:
            setup_module.requests.seen = self._answer

    def run(self, setup, controller, config: list[dict], use_proxy: bool = False) -> bool:
        """OSWorld's ``SetupController.setup(config, use_proxy)``: ``setup`` is the
        controller's own method, called once with no steps for its connection check
        (``False``: the VM server is unreachable, returned as is); then each step's
        ``_<type>_setup``. Raises ``Exception("Setup step N failed: ...")`` as OSWorld does,
        but for an ``open`` the server refused (a fact)."""
        self.failures = []
        if not setup([], use_proxy):
            return False
        for index, step in enumerate(config):
            step_type, parameters = step["type"], step.get("parameters") or {}
            method = f"_{step_type}_setup"
            assert hasattr(controller, method), f"Setup controller cannot find {method}"
            self._step, self._refused = (index, step_type, parameters), False
            try:
                getattr(controller, method)(**parameters)
            except Exception as exc:
                if step_type == "open" and self._refused:
                    continue
                raise Exception(f"Setup step {index + 1} failed: {method} - {exc}") from exc
            finally:
                self._step = None
        return True

    def _answer(self, url: str, response) -> None:
        """Called with every answer the setup controller gets to a POST."""
        if self._step is None:
            return
        index, step_type, parameters = self._step
        path = urllib.parse.urlparse(url).path
        body = _json(response)
        if path == "/setup/execute":
            code = body.get("returncode")
            if (
                response.status_code == 200
                and code not in (0, None)
                and not parameters.get("until")
            ):
                self._fail(index, step_type, code, body.get("error") or "")
        elif (
            path in ("/setup/activate_window", "/setup/close_window")
            and response.status_code < 400
            and self.postconfig
            and (response.headers.get(WINDOW_FOUND_HEADER) or "").lower() == "false"
        ):
            self._fail(index, step_type, None, _no_window(parameters))
        elif path in REFUSALS and response.status_code >= 400:
            if body.get("kind") not in REFUSAL_KINDS:
                return
            message = body.get("message") or response.text[:FAILURE_TAIL_CHARS]
            error = f"POST {path}: HTTP {response.status_code}: {message}"
            self._fail(index, step_type, body.get("returncode"), error)
            self._refused = True

    def _fail(self, index: int, step_type: str, exit_status, error: str) -> None:
        what = "postconfig" if self.postconfig else "setup"
        print(
            f"osworld-worker WARNING legato: {what} step {index} ({step_type}) failed, carrying "
            f"on as OSWorld does: exit status {exit_status}: {(error or '').strip()[-300:]}",
            file=sys.stderr,
            flush=True,
        )
        self.failures.append(
            {
                "step": index,
                "type": step_type,
                "exit_status": exit_status,
                "error": (error or "")[-FAILURE_TAIL_CHARS:],
            }
        )


def _no_window(parameters: dict) -> str:
    """``osworld_format.setup.no_window_message`` for a window step's parameters."""
    what = "class" if parameters.get("by_class") else "title"
    how = "is" if parameters.get("strict") else "contains"
    return f"no window whose {what} {how} {parameters.get('window_name')!r}"


class _Watched:
    """A stand-in for the ``requests`` module that reports every ``post`` answer."""

    def __init__(self, real, seen) -> None:
        self._real = real
        self.seen = seen

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def post(self, url, *args, **kwargs):
        response = self._real.post(url, *args, **kwargs)
        self.seen(url, response)
        return response


def _json(response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
