"""Which grader the local backend uses, and the names the installed desktop-env knows.

The local backend grades with OSWorld's own code (SetupController, ``DesktopEnv.evaluate``)
whenever an OSWorld interpreter is installed (``legato osworld install`` /
``scripts/osworld_venv.sh``), through the osworld worker attached to the desktop
(:mod:`..local.osworld_grader`); without one it falls back to the project's own subset
(``osworld_format``). Both ``legato tasks check`` and the engine's preflight ask
:func:`local_grader` / :func:`installed_grader`, so they judge a task against the same names
the run will use.

The venv is asked once (``worker.py --names``: desktop-env's sources are read, nothing of it
is imported); the answer is kept in ``$XDG_CACHE_HOME/legato/osworld-names/`` under a key of
the interpreter's path and its desktop-env install (dist-info name and modification time),
so a reinstall asks again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...osworld_format.grader_names import OWN_GRADER, GraderNames, osworld_grader
from ...tasks import Evaluation
from ...user_cache import legato_cache
from .channel import WORKER_SCRIPT
from .install import osworld_python
from .options import worker_env

NAMES_TIMEOUT_S = 60.0
GRADER_CHOICES = ("auto", "osworld", "own")


def _names_key(python: Path) -> str | None:
    """A key that changes when the interpreter or its desktop-env install changes; ``None``
    when desktop-env's dist-info is not where a venv keeps it (then nothing is cached)."""
    venv = python.parent.parent
    infos = sorted(venv.glob("lib/python3*/site-packages/desktop_env-*.dist-info"))
    if not infos:
        return None
    stamp = f"{python.resolve()}|{python}|{infos[0].name}|{infos[0].stat().st_mtime_ns}"
    return hashlib.sha256(stamp.encode()).hexdigest()[:32]


def _names_dir() -> Path:
    return legato_cache("osworld-names")


@functools.lru_cache(maxsize=8)
def installed_grader(python: str) -> GraderNames:
    """The metric, getter and step-type names of desktop-env under ``python`` (asked once per
    install, then cached on disk and in this process).

    Raises ``ConfigError`` when the interpreter cannot answer (no desktop-env, a crash, more
    than 60 s), naming the fix.
    """
    path = Path(python)
    key = _names_key(path)
    stored = _names_dir() / f"{key}.json" if key else None
    if stored is not None and stored.is_file():
        try:
            return osworld_grader(json.loads(stored.read_text()), str(path))
        except (ValueError, KeyError):
            pass  # a damaged cache entry: ask again
    try:
        done = subprocess.run(
            [str(path), "-I", str(WORKER_SCRIPT), "--names"],
            env=worker_env(provider=None),  # only lists names: no provider, no credential
            capture_output=True,
            timeout=NAMES_TIMEOUT_S,
            cwd="/",
        )
        names = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        names = None
    if not isinstance(names, dict) or not {
        "metrics",
        "getters",
        "step_types",
        "step_parameters",
    } <= set(names):
        raise ConfigError(
            f"the OSWorld interpreter {path} cannot list desktop-env's metrics and getters "
            "(fix: `legato osworld install`, or desktop option grader=own)"
        )
    if stored is not None:
        try:
            stored.parent.mkdir(parents=True, exist_ok=True)
            tmp = stored.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(names))
            tmp.replace(stored)
        except OSError:  # a cache that cannot be written (read-only): asked again next time
            pass
    return osworld_grader(names, str(path))


def grader_choice(options: dict[str, Any]) -> str:
    """Desktop option ``grader`` (``auto``, the default, ``osworld`` or ``own``); raises
    ``ConfigError`` naming the option for anything else."""
    choice = options.get("grader", "auto") or "auto"
    if choice not in GRADER_CHOICES:
        raise ConfigError(
            f"desktop option grader={choice!r}: use one of {', '.join(GRADER_CHOICES)}"
        )
    return choice


def local_grader(options: dict[str, Any]) -> tuple[GraderNames, Path | None]:
    """The local backend's grader for desktop ``options``: ``(names, interpreter)``.

    ``grader=own``: the own subset; ``osworld``: OSWorld's code (``ConfigError`` when no
    interpreter is installed); ``auto``: OSWorld's code when an interpreter is installed,
    else the own subset (interpreter ``None``).
    """
    choice = grader_choice(options)
    if choice == "own":
        return OWN_GRADER, None
    python = osworld_python(options)
    if python is None:
        if choice == "osworld":
            raise ConfigError(
                "desktop option grader=osworld needs the OSWorld venv (fix: `legato osworld "
                "install` or scripts/osworld_venv.sh, or option osworld_python=PATH)"
            )
        return OWN_GRADER, None
    return installed_grader(str(python)), python


def evaluation_of(answer: dict[str, Any]) -> Evaluation:
    """The worker's ``evaluate`` answer (``{reward, error, notes, postconfig_failures}``,
    ``worker.py``) as the :class:`~legato_pipelines.tasks.Evaluation` a desktop returns: the
    osworld backend's and the local backend's OSWorld grader read it the same way."""
    return Evaluation(
        float(answer["reward"]),
        answer.get("error"),
        tuple(answer.get("notes") or ()),
        tuple(answer.get("postconfig_failures") or ()),
    )
