"""The package's import structure: no circles, backends apart, OSWorld's task format below the desktops.

The graph is read with ``ast`` from the source (nothing is imported): an edge A -> B for every
``import``/``from ... import`` in module A naming module B of the package, at module level or
inside a function alike (a lazy import still ties the two modules). ``from pkg import name``
points at ``pkg.name`` when that is a module, else at ``pkg``. Importing ``a.b.c`` also runs
``a/__init__`` and ``a/b/__init__``; those implicit edges are not counted (a package's
``__init__`` is its face: it hands names on, and the factory in ``desktops/__init__`` imports
its backends lazily by design).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = "legato_pipelines"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> set[str]:
    """The package modules ``module`` imports (module level and inside functions)."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            targets = [
                f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # import a.b.c.name -> the module a.b.c
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != module:
                found.add(target)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert _cycles() == []


def test_osworld_format_never_imports_desktops():
    """The task runtime (setup steps, getters, metrics) is written against its own
    ``DesktopController`` protocol; the backends use it, never the other way round."""
    wrong = {
        (m, t)
        for m, targets in GRAPH.items()
        if m.startswith(f"{PACKAGE}.osworld_format")
        for t in targets
        if t.startswith(f"{PACKAGE}.desktops")
    }
    assert wrong == set()


#: The desktop building blocks: one may use another only through its package's face
#: (``desktops/server/__init__.py``: what it exports), never its modules.
BLOCKS = {
    "server": f"{PACKAGE}.desktops.server",
    "osworld_worker": f"{PACKAGE}.desktops.osworld_worker",
}
#: The backends (``desktops/backends/<name>.py``), above the building blocks.
BACKENDS_PACKAGE = f"{PACKAGE}.desktops.backends"


def _block_of(module: str) -> str | None:
    for name, prefix in BLOCKS.items():
        if module == prefix or module.startswith(prefix + "."):
            return name
    return None


def test_building_blocks_meet_through_their_faces():
    wrong = set()
    for module, targets in GRAPH.items():
        own = _block_of(module)
        if own is None:
            continue
        for target in targets:
            other = _block_of(target)
            if other is not None and other != own and target != BLOCKS[other]:
                wrong.add((module, target))
    assert wrong == set()


def test_no_backend_imports_another():
    """Issue 35: the backends share building blocks (the desktop server, the OSWorld worker),
    never each other's module; nor does a building block import a backend."""
    wrong = {
        (module, target)
        for module, targets in GRAPH.items()
        for target in targets
        if target.startswith(BACKENDS_PACKAGE + ".")
        and (module.startswith(BACKENDS_PACKAGE + ".") or _block_of(module) is not None)
    }
    assert wrong == set()


def test_the_import_rules_see_a_backend_import():
    """Guards the two rules above: the edges they judge exist in the graph."""
    local, osworld = f"{BACKENDS_PACKAGE}.local", f"{BACKENDS_PACKAGE}.osworld"
    assert f"{PACKAGE}.desktops.registry" in GRAPH[local] and osworld in MODULES
    assert f"{PACKAGE}.desktops.server" in GRAPH[f"{PACKAGE}.desktops.osworld_worker.desktop"]


def test_the_graph_is_read():
    """Guards the reader itself: known edges are found."""
    assert f"{PACKAGE}.desktops.base" in GRAPH[f"{PACKAGE}.rollout.attempt"]
    assert f"{PACKAGE}.errors" in GRAPH[f"{PACKAGE}.desktops.backends.fake"]


def in_a_child(probe: str) -> str:
    """Run ``probe`` in a new interpreter from the repository's root; its stdout, stripped
    (fails the test when the child fails)."""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT.parent, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_legato_collect_imports_no_numpy_pyarrow_or_duckdb():
    """``legato collect`` on fake desktops starts without numpy, pyarrow or duckdb (~0.15 s
    of CPU at every start; issue 18): they are imported where tables are made or queried."""
    probe = (
        "import sys; import legato_pipelines.cli, legato_pipelines.rollout.engine, "
        "legato_pipelines.desktops.backends.fake, legato_pipelines.policy.client; "
        "print(sorted(m for m in ('numpy', 'pyarrow', 'duckdb') if m in sys.modules))"
    )
    assert in_a_child(probe) == "[]"


def test_the_desktop_server_imports_no_client_side():
    """A desktop server (one per desktop, started by every batch) imports neither httpx, the
    engine, the backend's client side, the policy client, nor the task schemas (pydantic),
    the harness or OSWorld's task format beyond the one constant it uses (0.77 -> 0.50 s of
    CPU per start on the 2-core machine; issue 18): the package, ``desktops``,
    ``desktops.server`` and ``osworld_format`` hand their names on lazily."""
    probe = (
        "import sys; import legato_pipelines.desktops.server.main; "
        "print(sorted(m for m in ('httpx', 'legato_pipelines.rollout.engine', "
        "'legato_pipelines.desktops.server.desktop', 'legato_pipelines.policy.client', "
        "'legato_pipelines.desktops.client', 'pydantic', 'legato_pipelines.tasks', "
        "'legato_pipelines.harness', 'legato_pipelines.desktops.base', "
        "'legato_pipelines.osworld_format.classify') if m in sys.modules))"
    )
    assert in_a_child(probe) == "[]"


def test_the_lazy_public_names_are_the_modules_own():
    import legato_pipelines
    import legato_pipelines.desktops.server as local
    from legato_pipelines.desktops.server.desktop import open_local_desktops
    from legato_pipelines.rollout.engine import collect

    assert legato_pipelines.collect is collect and local.open_local_desktops is open_local_desktops
    assert all(getattr(legato_pipelines, name) is not None for name in legato_pipelines.__all__)
    assert all(getattr(local, name) is not None for name in local.__all__)
    import legato_pipelines.desktops as desktops
    import legato_pipelines.osworld_format as osworld_format
    from legato_pipelines.desktops.base import DesktopConfig
    from legato_pipelines.osworld_format.verdict import preflight

    assert desktops.DesktopConfig is DesktopConfig and osworld_format.preflight is preflight
    for package in (desktops, osworld_format):
        assert all(getattr(package, name) is not None for name in package.__all__)


def test_the_legato_command_freezes_its_objects_on_the_way_out():
    """``legato`` ends with ``gc.freeze()`` (:func:`legato_pipelines.cli.main`): the
    interpreter's teardown then skips its last full collection over every object (~0.2 s of
    each ``legato collect``). Run in a child: the probe exits the way the command does."""
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 10_000))\n"
        "sys.argv = ['legato', '--help']\n"
        "from legato_pipelines.cli import main\n"
        "main()\n"
    )
    assert in_a_child(probe).endswith("frozen True")


#: The names of the built-in backends, and the modules that may use them as backend names:
#: the registry and the backends' own modules (docs/backends.md). Everything else asks the
#: registry for a backend's capabilities.
BACKEND_NAMES = frozenset({"local", "osworld", "fake"})
MAY_NAME_BACKENDS = (f"{PACKAGE}.desktops.registry", f"{PACKAGE}.desktops.backends")

#: The same words where they are no backend's name, per module, with what they name there.
OTHER_MEANINGS: dict[str, dict[str, str]] = {
    f"{PACKAGE}.desktops.child_env": {"local": "DesktopEnv provider"},
    f"{PACKAGE}.desktops.osworld_worker.desktop": {"local": "DesktopEnv provider"},
    f"{PACKAGE}.desktops.osworld_worker.desktop_grader": {"local": "DesktopEnv provider"},
    f"{PACKAGE}.desktops.osworld_worker.options": {"local": "DesktopEnv provider"},
    f"{PACKAGE}.desktops.osworld_worker.template": {"local": "DesktopEnv provider"},
    f"{PACKAGE}.desktops.osworld_worker.worker_desktop_env": {"local": "DesktopEnv provider"},
    f"{PACKAGE}.desktops.osworld_worker.grader": {"osworld": "grader choice"},
    f"{PACKAGE}.osworld_format.grader_names": {"osworld": "grader kind"},
    f"{PACKAGE}.desktops.osworld_worker.channel": {"osworld": "a worker's default name"},
    f"{PACKAGE}.desktops.server.remote": {"local": "option 'local' (desktops started here)"},
    f"{PACKAGE}.rollout.settings": {"local": "option 'local' (desktops started here)"},
    f"{PACKAGE}.desktops.server.session": {"local": "useradd's group 'local'"},
    f"{PACKAGE}.cli.osworld": {"osworld": "the `legato osworld` command"},
    f"{PACKAGE}.tasks": {"fake": "a task's 'fake' block"},
    f"{PACKAGE}.assets.config": {"fake": "examples/tasks/fake"},
    # the task verdict's kinds (desktops/registry.py TaskChecks): its public output (legato
    # tasks check --json) is keyed by them; each backend says which kind checks its tasks
    f"{PACKAGE}.osworld_format.problems": dict.fromkeys(BACKEND_NAMES, "the verdict's kind"),
    f"{PACKAGE}.osworld_format.classify": dict.fromkeys(BACKEND_NAMES, "the verdict's kind"),
    f"{PACKAGE}.cli.tasks": dict.fromkeys(BACKEND_NAMES, "the verdict's kind"),
    # a demo of two backends by name: the local task suite, else fake desktops
    f"{PACKAGE}.cli.demo": {"local": "the demo's real desktops", "fake": "its fallback"},
}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of ``tree`` (module, classes, functions)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def backend_names_in(source: str, allowed: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """``(line, word)`` of each string literal in ``source`` that is a built-in backend's name
    (docstrings and f-string text aside), except the words of ``allowed``."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):  # text inside f-strings is prose, not a name compared
        if isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in node.values if isinstance(v, ast.Constant)}
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and node.value in BACKEND_NAMES
        and id(node) not in skip
        and node.value not in (allowed or {})
    )


def test_only_the_registry_and_the_backends_name_a_backend():
    """Issue 35: a backend is one module and one registry entry; the engine, the verdict, the
    CLI and Dagster ask the registry (its capabilities), never compare a name."""
    wrong = {
        module: found
        for module, path in MODULES.items()
        if not module.startswith(MAY_NAME_BACKENDS)
        and (found := backend_names_in(path.read_text(), OTHER_MEANINGS.get(module)))
    }
    assert wrong == {}


def test_the_name_rule_sees_a_name():
    """Guards the rule itself: a comparison with a backend's name is found; a docstring, an
    f-string's text and a word listed with another meaning are not."""
    source = (
        'def f(c):\n    """local"""\n    print(f"local {c}")\n'
        '    return c.backend == "local" or c.provider == "osworld"\n'
    )
    assert backend_names_in(source) == [(4, "local"), (4, "osworld")]
    assert backend_names_in(source, {"osworld": "a provider"}) == [(4, "local")]
