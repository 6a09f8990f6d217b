"""Preflight: what makes an OSWorld-format task unrunnable on a backend, before any desktop starts.

:func:`task_problems` is one task's list of what its config gets wrong for a backend, which
:mod:`.classify` completes with what the host lacks; :func:`.verdict.preflight` (what
``legato collect`` and ``legato tasks check`` call) lists them per task. Nothing here touches
a desktop or the network.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from ..tasks import Task, fake_config_problem
from .evaluate import evaluator_parts, evaluator_unsupported
from .grader_names import OWN_GRADER, GraderNames
from .metrics import METRICS
from .sources import find_source, is_internet_url

BackendName = Literal["local", "osworld", "fake"]

BACKENDS: tuple[BackendName, ...] = ("local", "osworld", "fake")

# Parameters a setup step cannot run without (this runtime's handlers, as OSWorld's
# SetupController ``_<type>_setup`` signatures).
REQUIRED_STEP_PARAMETERS: dict[str, tuple[str, ...]] = {
    "launch": ("command",),
    "execute": ("command",),
    "command": ("command",),
    "open": ("path",),
    "activate_window": ("window_name",),
    "close_window": ("window_name",),
    "download": ("files",),
    "upload": ("files",),
    "upload_file": ("files",),
}
# Keys a getter config cannot work without (see :mod:`.getters`).
REQUIRED_GETTER_KEYS: dict[str, tuple[str, ...]] = {
    "vm_file": ("path", "dest"),
    "vm_command_line": ("command",),
    "rule": ("rules",),
    "cache_file": ("path",),
    "cloud_file": ("path", "dest"),
}


def _did_you_mean(name: Any, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for a close spelling (difflib ratio >= 0.75), else ``""``."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _missing_parameter(where: str, params: dict, name: str, what: str) -> str:
    """The problem text for a missing required key, naming a present key that looks misspelled."""
    close = difflib.get_close_matches(name, [str(k) for k in params], n=1, cutoff=0.6)
    found = f"; found {close[0]!r}: a misspelling of {name!r}?" if close else ""
    fix = f"rename {close[0]!r} to {name!r}" if close else f"add {name!r}"
    return f"field '{where}.{name}': {what} needs parameter {name!r}, it is missing{found} (fix: {fix})"


def _metric_needs_expected(name: str, options: dict) -> str | None:
    """The name of the metric's second positional parameter when it has no default and
    ``options`` does not supply it (OSWorld calls ``metric(result, expected, **options)``,
    or ``metric(result, **options)`` without an ``expected``), else ``None``."""
    try:
        params = list(inspect.signature(METRICS[name]).parameters.values())
    except (KeyError, TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 or positional[1].default is not inspect.Parameter.empty:
        return None
    return None if positional[1].name in options else positional[1].name


def _grader_for(backend: str, grader: GraderNames | None) -> GraderNames | None:
    """The names to check against: ``local`` always has a grader (default: the own subset);
    ``osworld`` only when the installed desktop-env's names are known."""
    if backend == "local":
        return grader or OWN_GRADER
    return grader if backend == "osworld" else None


def _fix_hint(grader: GraderNames) -> str:
    if grader.kind == "own":
        return "fix: correct the name, install the OSWorld venv (`legato osworld install`) or run the task on the osworld backend"
    return "fix: correct the name; a name the installed desktop-env lacks cannot be graded by it"


def _step_problems(
    steps: Any,
    field: str,
    task: Task,
    backend: str,
    cache_dir: Path | None,
    grader: GraderNames | None = None,
) -> list[str]:
    """Problems of setup/postconfig ``steps`` (``field`` names the list, e.g. ``config.config``)."""
    if not isinstance(steps, list):
        return [f"field '{field}' must be a list of setup steps (fix: wrap the steps in [...])"]
    problems: list[str] = []
    for i, step in enumerate(steps):
        where = f"{field}[{i}]"
        if not isinstance(step, dict) or not isinstance(step.get("type"), str):
            problems.append(f"field '{where}.type' must be a setup step type (a string)")
            continue
        step_type, params = step["type"], step.get("parameters") or {}
        if not isinstance(params, dict):
            problems.append(f"field '{where}.parameters' must be an object")
            continue
        names = _grader_for(backend, grader)
        if names is not None and step_type not in names.step_types:
            problems.append(
                f"field '{where}.type': step type {step_type!r} is not supported by "
                f"{names.source}{_did_you_mean(step_type, names.step_types)} (supported: "
                f"{', '.join(sorted(names.step_types))}; {_fix_hint(names)})"
            )
            continue
        problems += _parameter_problems(f"{where}.parameters", step_type, params, names)
        if backend != "local":
            continue
        if step_type == "sleep" and "seconds" in params:
            seconds = params["seconds"]
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
                problems.append(
                    f"field '{where}.parameters.seconds' must be a number >= 0, got {seconds!r}"
                )
        files = params.get("files")
        if step_type in ("download", "upload", "upload_file") and isinstance(files, list):
            for j, file in enumerate(files):
                fwhere = f"{where}.parameters.files[{j}]"
                if not isinstance(file, dict):
                    problems.append(f"field '{fwhere}' must be an object")
                    continue
                if step_type == "download":
                    problems += _download_problems(fwhere, file, task, cache_dir)
                elif not file.get("path"):
                    problems.append(
                        _missing_parameter(fwhere, file, "path", f"an {step_type} file")
                    )
                elif "content" not in file and not file.get("local_path"):
                    problems.append(
                        f"field '{fwhere}': an {step_type} file needs 'local_path' or 'content' "
                        "(fix: add one of them)"
                    )
    return problems


def _parameter_problems(
    where: str, step_type: str, params: dict, names: GraderNames | None
) -> list[str]:
    """Missing and unknown parameters of one setup step: against desktop-env's own
    ``SetupController._<type>_setup`` signature when ``names`` has it (OSWorld calls it with
    the parameters as keywords: an unknown one is "unexpected keyword argument" at reset), else
    :data:`REQUIRED_STEP_PARAMETERS` (the own subset; the osworld backend without a venv)."""
    signature = names.step_parameters.get(step_type) if names is not None else None
    required = signature.required if signature else REQUIRED_STEP_PARAMETERS.get(step_type, ())
    missing = [name for name in required if params.get(name) in (None, "", [])]
    problems = [_missing_parameter(where, params, n, f"a {step_type} step") for n in missing]
    # a key already named as a misspelling of a missing one is not reported twice
    named = {c for n in missing for c in difflib.get_close_matches(n, list(params), 1, 0.6)}
    if signature and signature.accepted is not None:
        for name in params:
            if name not in signature.accepted and name not in named:
                problems.append(
                    f"field '{where}.{name}': a {step_type} step takes no parameter {name!r}"
                    f"{_did_you_mean(name, signature.accepted)} (accepted: "
                    f"{', '.join(signature.accepted)}; {names.source} fails at reset with "
                    '"unexpected keyword argument"; fix: rename or remove it)'
                )
    return problems


def _download_problems(fwhere: str, file: dict, task: Task, cache_dir: Path | None) -> list[str]:
    problems = [
        _missing_parameter(fwhere, file, name, "a download file")
        for name in ("url", "path")
        if not file.get(name)
    ]
    url = file.get("url")
    if url and not find_source(
        str(url), dest=file.get("path"), cache_dir=cache_dir, task_id=task.task_id
    ):
        problems.append(_source_problem(f"{fwhere}.url", str(url), cache_dir))
    return problems


def _source_problem(field: str, url: str, cache_dir: Path | None) -> str:
    if not is_internet_url(url):
        return f"field '{field}': {url} does not exist (fix: create the file or correct the URL)"
    where = f"not in the file cache {cache_dir}" if cache_dir else "no file cache (cache_dir '')"
    return (
        f"field '{field}': {url} needs the internet ({where}; local desktops never download; "
        "fix: fetch it with `legato osworld cache TASKS`, into its default directory, which collect and tasks check read when given no cache, or into DIR passed as `--desktop-option cache_dir=DIR` / `legato tasks check --cache-dir DIR`; or run the task on the osworld backend)"
    )


def evaluator_problems(
    task: Task, backend: str, cache_dir: Path | None, grader: GraderNames | None = None
) -> list[str]:
    """Problems of the task's evaluator for ``local`` (everything, names against ``grader``:
    default the own subset) or ``osworld`` (structure; names too when ``grader`` is given)."""
    evaluator = task.config.get("evaluator")
    if not evaluator:
        return [
            "field 'config.evaluator' is missing: the task cannot be graded (fix: add an "
            'evaluator {"func", "result", "expected"} in OSWorld\'s format, or run it on the fake backend)'
        ]
    if not isinstance(evaluator, dict):
        return ['field \'config.evaluator\' must be an object (fix: {"func": ..., "result": ...})']
    func = evaluator.get("func")
    if not (
        isinstance(func, str)
        or (isinstance(func, list) and func and all(isinstance(f, str) for f in func))
    ):
        return [
            "field 'config.evaluator.func' must be a metric name or a list of them (fix: add it)"
        ]
    problems = _step_problems(
        evaluator.get("postconfig") or [],
        "config.evaluator.postconfig",
        task,
        backend,
        cache_dir,
        grader,
    )
    names = _grader_for(backend, grader)
    if func == "infeasible":
        return problems
    try:
        parts = evaluator_parts(evaluator)
    except ValueError as exc:
        return [*problems, f"field 'config.evaluator': {str(exc).removeprefix('evaluator: ')}"]
    listed = isinstance(func, list)
    for i, (name, result, expected, options) in enumerate(parts):
        at = f"[{i}]" if listed else ""
        if result is None:
            problems.append(
                f"field 'config.evaluator.result{at}' is missing: metric {name!r} needs a result "
                'getter (fix: add e.g. {"type": "vm_file", "path": ..., "dest": ...})'
            )
        if names is None:
            continue
        if name not in names.metrics:
            problems.append(
                f"field 'config.evaluator.func{at}': metric {name!r} is unknown to "
                f"{names.source}{_did_you_mean(name, names.metrics)} ({_fix_hint(names)})"
            )
        elif (
            names.kind == "own"
            and expected is None
            and (param := _metric_needs_expected(name, options))
        ):
            problems.append(
                f"field 'config.evaluator.expected{at}' is missing: metric {name!r} needs its "
                f'{param!r} argument (fix: add an expected getter, e.g. {{"type": "rule", "rules": ...}})'
            )
        for side, getter in (("result", result), ("expected", expected)):
            if getter is None:
                continue
            gwhere = f"config.evaluator.{side}{at}"
            if not isinstance(getter, dict):
                problems.append(f"field '{gwhere}' must be a getter object {{\"type\": ...}}")
                continue
            kind = getter.get("type")
            if kind not in names.getters:
                problems.append(
                    f"field '{gwhere}.type': getter {kind!r} is unknown to {names.source}"
                    f"{_did_you_mean(kind, names.getters)} ({_fix_hint(names)})"
                )
                continue
            if backend != "local":
                continue
            problems += [
                _missing_parameter(gwhere, getter, key, f"a {kind} getter")
                for key in REQUIRED_GETTER_KEYS.get(kind, ())
                if getter.get(key) in (None, "", [])
            ]
            if kind == "cloud_file" and getter.get("path") and getter.get("dest"):
                multi = bool(getter.get("multi"))
                urls = getter["path"] if multi else [getter["path"]]
                dests = getter["dest"] if multi else [getter["dest"]]
                for url, dest in zip(urls, dests, strict=False):
                    if not find_source(
                        str(url), dest=dest, cache_dir=cache_dir, task_id=task.task_id
                    ):
                        problems.append(_source_problem(f"{gwhere}.path", str(url), cache_dir))
    if backend == "local":
        if listed and evaluator.get("conj", "and") not in ("and", "or"):
            problems.append(
                f"field 'config.evaluator.conj' must be 'and' or 'or', got {evaluator['conj']!r}"
            )
        problems += [
            f"field 'config.evaluator.options': {part} is not supported locally "
            "(fix: run the task on the osworld backend)"
            for part in evaluator_unsupported(evaluator)
            if part.startswith("compare_table") and names.kind == "own"
        ]
    return problems


def _fake_problems(task: Task) -> list[str]:
    problem = fake_config_problem(task.config)
    return [problem] if problem else []


def task_problems(
    task: Task,
    backend: str,
    *,
    cache_dir: Path | None = None,
    grader: GraderNames | None = None,
) -> list[str]:
    """What the task list itself gets wrong for ``backend`` (see :func:`preflight`), without
    the ``tasks[i] (task_id ...)`` prefix; ``grader``: the names the backend's grader knows
    (``local``: default the own subset; ``osworld``: checked only when given). What the host
    lacks (apps, the internet) is :mod:`.classify`'s part of the verdict. Empty: nothing in
    the task's config stops it.

    Raises ``ValueError`` for a backend other than ``local``, ``osworld`` or ``fake``.
    """
    if backend not in BACKENDS:
        raise ValueError(
            f"preflight: backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
        )
    if backend == "fake":
        return _fake_problems(task)
    problems = _step_problems(
        task.config.get("config") or [], "config.config", task, backend, cache_dir, grader
    )
    return problems + evaluator_problems(task, backend, cache_dir, grader)
