"""desktop_env's evaluator modules in the worker: its ``metrics`` and ``getters`` packages made
lazy (a task imports only the modules of the functions it names), heavy imports deferred,
the names a task's evaluator uses checked, and the installed desktop-env's names listed
(``worker.py --names``, read by ``grader.py``).

Loaded under the OSWorld interpreter as a module of the package ``legato_osworld`` that
``worker.py`` makes of this directory (:func:`worker.as_package`): standard library and
``desktop_env`` only, its siblings by relative import.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types

from .worker_process import WorkerError


def install_lazy_evaluators() -> None:
    """Make ``desktop_env.evaluators.metrics`` and ``.getters`` lazy packages.

    docs/osworld.md §8: their ``__init__`` imports every metric module (easyocr -> torch, librosa,
    cv2, ...). Here each package module is created without running its ``__init__``'s imports;
    a name the ``__init__`` imports ``from .sub import name`` is imported from ``sub`` on first
    access, so a task pulls in only the modules of the functions it names. Other statements of
    the ``__init__`` (e.g. ``def infeasible()``) run as written. Must run before
    ``desktop_env.desktop_env`` or ``desktop_env.controllers.setup`` is imported.
    """
    evaluators = importlib.import_module("desktop_env.evaluators")
    for name in ("metrics", "getters"):
        full = f"desktop_env.evaluators.{name}"
        if full in sys.modules:
            continue
        directory = os.path.join(os.path.dirname(evaluators.__file__), name)
        init = os.path.join(directory, "__init__.py")
        with open(init, encoding="utf-8") as f:
            tree = ast.parse(f.read(), init)
        where: dict[str, str] = {}
        rest = []
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                for alias in node.names:
                    where[alias.asname or alias.name] = node.module
            else:
                rest.append(node)
        spec = importlib.machinery.ModuleSpec(full, None, is_package=True)
        spec.submodule_search_locations = [directory]
        module = importlib.util.module_from_spec(spec)
        module.__file__ = init

        def lazy(attr: str, _module=module, _where=where, _full=full):
            sub = _where.get(attr)
            if sub is None:
                raise AttributeError(f"module {_full!r} has no attribute {attr!r}")
            value = getattr(importlib.import_module(f"{_full}.{sub}"), attr)
            setattr(_module, attr, value)
            return value

        module.__getattr__ = lazy
        sys.modules[full] = module
        setattr(evaluators, name, module)
        exec(compile(ast.Module(body=rest, type_ignores=[]), init, "exec"), module.__dict__)
    for name in DEFERRED_IMPORTS:
        defer_import(name)


#: Modules imported at the top of metric modules but used by few metrics: ``metrics/docs.py``
#: imports easyocr (-> torch) for ``compare_image_text`` alone (docs/osworld.md §7, §8).
DEFERRED_IMPORTS = ("easyocr",)


def defer_import(name: str) -> None:
    """Let ``import name`` succeed at once; the real import happens on first attribute use
    (and its ImportError is raised there, inside the one metric that needs it)."""
    if name in sys.modules:
        return
    stub = types.ModuleType(name)

    def real(attr: str):
        if sys.modules.get(name) is stub:
            del sys.modules[name]
            try:
                importlib.import_module(name)
            except BaseException:
                sys.modules[name] = stub
                raise
        return getattr(sys.modules[name], attr)

    stub.__getattr__ = real
    sys.modules[name] = stub


def evaluator_names(task: dict) -> list[tuple[str, str]]:
    """``(package, name)`` of every metric and getter a task's evaluator names (docs/osworld.md §3)."""
    evaluator = task.get("evaluator") or {}
    names = []
    funcs = evaluator.get("func")
    for func in funcs if isinstance(funcs, list) else [funcs]:
        if func:
            names.append(("metrics", func))
    for key in ("result", "expected"):
        specs = evaluator.get(key)
        for spec in specs if isinstance(specs, list) else [specs]:
            if isinstance(spec, dict) and spec.get("type"):
                names.append(("getters", f"get_{spec['type']}"))
    return names


def evaluator_function(package: str, name: str):
    """The metric or getter ``name`` of ``package`` (``"metrics"`` | ``"getters"``), imported
    now through the lazy packages (:func:`install_lazy_evaluators`: only its module is
    imported). Raises ``AttributeError`` for a name desktop-env does not have, ``ImportError``
    when its module needs what the venv lacks."""
    from desktop_env import evaluators

    return getattr(getattr(evaluators, package), name)


def check_evaluator(task: dict) -> None:
    """Import the task's metrics and getters now (lazily, as DesktopEnv.reset would).

    Raises ``WorkerError("evaluator")`` naming a function desktop-env 1.0.2 does not have, or
    the module a function's file needs (fix: ``legato osworld install --full``), before the
    task's setup runs rather than at the end of the attempt.
    """
    for package, name in evaluator_names(task):
        try:
            evaluator_function(package, name)
        except AttributeError:
            raise WorkerError(
                "evaluator",
                f"desktop-env 1.0.2 has no {package[:-1]} {name!r} (task {task.get('id')!r})",
            ) from None
        except ImportError as exc:
            raise WorkerError(
                "evaluator",
                f"{package[:-1]} {name!r} cannot be imported: {exc} "
                "(fix: legato osworld install --full, or add the package to the OSWorld venv)",
            ) from None


def installed_names() -> dict:
    """The names this interpreter's desktop-env offers, read from its sources (nothing of
    desktop_env is imported, so this takes well under a second).

    ``{"version", "metrics", "getters", "step_types", "step_parameters"}``: ``metrics`` /
    ``getters`` are what
    ``desktop_env.evaluators.metrics`` / ``.getters`` export (their ``__init__``'s relative
    imports and its own definitions; getters without the ``get_`` prefix, as a task's
    ``"type"`` names them); ``step_types`` the ``SetupController._<type>_setup`` methods
    (what a task's ``config`` step ``type`` may be); ``step_parameters`` per step type
    ``{"required": [...], "accepted": [...] | None}`` from that method's signature
    (SetupController calls it with the step's ``parameters`` as keywords, so a name outside
    ``accepted`` fails at reset; ``None``: it takes ``**kwargs``). Raises
    ``WorkerError("protocol")`` when desktop_env is not installed here.
    """
    from importlib import metadata

    spec = importlib.util.find_spec("desktop_env")
    if spec is None or not spec.submodule_search_locations:
        raise WorkerError("protocol", "desktop_env is not installed in this interpreter")
    root = list(spec.submodule_search_locations)[0]

    def exported(package: str) -> list[str]:
        init = os.path.join(root, "evaluators", package, "__init__.py")
        with open(init, encoding="utf-8") as f:
            tree = ast.parse(f.read(), init)
        names = []
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names += [alias.asname or alias.name for alias in node.names]
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.append(node.name)
        return sorted(set(names))

    setup_py = os.path.join(root, "controllers", "setup.py")
    with open(setup_py, encoding="utf-8") as f:
        tree = ast.parse(f.read(), setup_py)
    methods = {
        node.name[1 : -len("_setup")]: node.args
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("_")
        and node.name.endswith("_setup")
        and len(node.name) > len("__setup")
    }
    steps = sorted(methods)
    parameters = {}
    for step, args in methods.items():
        named = [a.arg for a in args.posonlyargs + args.args][1:]  # without self
        without_default = len(named) - len(args.defaults)
        kwonly = [a.arg for a in args.kwonlyargs]
        parameters[step] = {
            "required": named[:without_default]
            + [a for a, d in zip(kwonly, args.kw_defaults, strict=True) if d is None],
            "accepted": None if args.kwarg else named + kwonly,
        }
    getters = [n[len("get_") :] for n in exported("getters") if n.startswith("get_")]
    try:
        version = metadata.version("desktop-env")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "version": version,
        "metrics": exported("metrics"),
        "getters": getters,
        "step_types": steps,
        "step_parameters": parameters,
    }
