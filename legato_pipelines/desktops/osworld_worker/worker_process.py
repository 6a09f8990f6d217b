"""The OSWorld worker process's plumbing, shared by its modules: the error a request fails
with, loading a module of the project by its path (this interpreter cannot import the
project's package), and ending the worker with its collector.

Loaded under the OSWorld interpreter as a module of the package ``legato_osworld`` that
``worker.py`` makes of this directory (:func:`worker.as_package`): standard library and
``desktop_env`` only, its siblings by relative import.
"""

from __future__ import annotations

import importlib.util
import os
import select
import sys
import threading
import types


class WorkerError(Exception):
    """A request failed; ``kind`` is the failure kind the backend records."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, at most ~1000 characters (for an error's message)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 1000 else text[:1000] + "..."


def load_by_path(relative: str, name: str):
    """A standard-library-only module of the package (``relative`` to ``legato_pipelines/``),
    loaded by its path: this interpreter cannot import the project's package."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(name, os.path.join(package, relative))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_sibling(name: str) -> types.ModuleType:
    """Import ``<name>.py`` from this file's directory by path (``-I`` keeps the script's
    directory off ``sys.path``), once, as ``legato_osworld_<name>``."""
    full = f"legato_osworld_{name}"
    if full in sys.modules:
        return sys.modules[full]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(full, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


def end_with_input(fd: int, gone) -> None:
    """Call ``gone()`` once the other end of the protocol's input ``fd`` (a pipe or a socket)
    has closed: the collector ended (or closed it). A thread polls ``fd`` for its hang-up
    alone (no read: the requests stay for :func:`serve`). For a confined worker, which cannot
    see its collector's pid (:func:`end_with_client`)."""

    def wait() -> None:
        poll = select.poll()
        poll.register(fd, select.POLLRDHUP)  # POLLHUP and POLLERR always count
        while not poll.poll():
            pass
        gone()

    threading.Thread(target=wait, name="end-with-input", daemon=True).start()


def end_with_client(pid: int, gone) -> None:
    """Call ``gone()`` (:meth:`Worker.client_gone`: SIGTERM to this worker, whose handler
    stops the VM and exits) as soon as process ``pid``, the collector it serves, ends: a
    thread waits on the process's pidfd. Without it a worker whose collector was killed
    (SIGKILL, the OOM killer) ran on until its next read or write of the protocol, which in
    one of DesktopEnv's retry loops (SetupController: 20 x 5 s) is ~100 s later. Calls
    ``gone()`` at once when ``pid`` already ended; does nothing where there is no
    ``os.pidfd_open`` (Linux < 5.3)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        gone()
        return
    except (AttributeError, OSError):
        return

    def wait() -> None:
        poll = select.poll()
        poll.register(fd, select.POLLIN)  # readable once the process ended
        poll.poll()
        gone()

    threading.Thread(target=wait, name="end-with-client", daemon=True).start()
