"""The desktop backends by name: one place that knows them (Gymnasium's ``register``/``make``).

Each backend is one module (``desktops/backends/<name>.py``) that calls :func:`register` with
a :class:`BackendSpec`: its opener, its typed options model (pydantic), its support check
(what it offers on this host, for the task verdict), its capabilities and, optionally, its
warm-up. The engine, the verdict, the CLI and Dagster ask this module (:func:`get`) for a
backend and its capabilities; no code outside the backend modules and this one compares a
backend's name (``tests/test_package_imports.py`` holds it so). ``docs/backends.md`` tells how
to write a backend.

The built-in backends' modules are imported on the first look-up (:data:`BUILTIN`), so that
importing this module costs nothing: the desktop server and ``legato``'s first line
(``desktops/early.py``) import it without pydantic. Backends of other packages come in as
plugins, loaded on the first look-up of a name that is not built in: the modules named by
the environment variable ``LEGATO_BACKEND_MODULES`` (comma-separated, each imported once; it
calls :func:`register`) and the Python entry points of group :data:`ENTRY_POINT_GROUP`
(name: the backend's, value: its module, or a :class:`BackendSpec` in it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ..osworld_format.classify import BackendSupport

#: ``DesktopConfig`` and ``Desktop`` (``base.py``, which imports this module: named here
#: without the import).
DesktopConfig = Any
Desktop = Any

#: The backend a desktop config, ``legato collect`` and ``LEGATO_BACKEND`` use when none is
#: named: the only place a default backend is declared.
DEFAULT_BACKEND = "fake"

#: The built-in backends: name -> the module (below ``legato_pipelines.desktops``) that
#: registers it when imported. A backend of another package calls :func:`register` itself.
BUILTIN: dict[str, str] = {
    "fake": ".backends.fake",
    "local": ".backends.local",
    "osworld": ".backends.osworld",
}

#: The environment variable naming the modules (comma-separated, importable from
#: ``sys.path``/``PYTHONPATH``) that register backends of their own when imported: a backend
#: written outside any package (a scratch module) becomes usable from the command line.
MODULES_ENV = "LEGATO_BACKEND_MODULES"

#: The entry-point group of backends of other packages (``[project.entry-points.
#: "legato_pipelines.backends"] toy = "toy_pkg.backend"``): name -> a module that registers
#: the backend when imported, or a :class:`BackendSpec` object (registered when loaded).
ENTRY_POINT_GROUP = "legato_pipelines.backends"

#: Backends that start processes on ``legato``'s first line (``desktops/early.py``): name ->
#: a module (below ``legato_pipelines.desktops``) whose ``templates_for(options)`` lists them,
#: stdlib-only (that line runs before pydantic, so not the backend's own module).
EARLY: dict[str, str] = {"local": ".backends.local_early"}

#: Which of the task verdict's kinds (``osworld_format.problems.BACKENDS``) checks a task for a
#: backend: ``local`` (the project's OSWorld-format runtime runs setup and grading on a desktop
#: of this host: every check, the host's apps included), ``osworld`` (OSWorld's own DesktopEnv
#: does: the structure, and names when the installed desktop-env's are known), ``fake``
#: (nothing of OSWorld's format runs: only the task's ``fake`` block). The verdict's kinds
#: still carry the built-in backends' names (its public output, ``legato tasks check
#: --json``, is keyed by them); a new backend picks the kind that fits it.
TaskChecks = Literal["local", "osworld", "fake"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend does with given options, for the code that must choose without knowing
    its name (the engine, the settings, the CLI, the Dagster resources).

    opens_late      desktops are started here and more can be opened after the batch's first
                    ones (spares that join late, ``open_desktops(first=...)``)
    default_spares  a batch of two runners or more opens one spare per runner unless told
                    otherwise (``rollout/settings.py`` :func:`spare_desktops`)
    attaches_urls   the backend takes option ``urls`` (desktop servers by URL)
    chooses_network it starts sandboxed desktop servers here whose network ``desktops/network.py``
                    chooses (``auto``: ``own`` for a batch whose tasks need one)
    scratch         its desktops leave directories in the temp folder, which the batch's first
                    opening sweeps of killed processes' leftovers (``scratch.py``)
    task_checks     the verdict's kind that checks a task for it (:data:`TaskChecks`)
    """

    opens_late: bool = False
    default_spares: bool = False
    attaches_urls: bool = False
    chooses_network: bool = False
    scratch: bool = True
    task_checks: TaskChecks = "local"


Opener = Callable[[DesktopConfig, int, int], Awaitable[Sequence[Desktop]]]


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend, as registered.

    name          its name (``DesktopConfig.backend``, ``--backend``, ``LEGATO_BACKEND``)
    summary       one line for ``--help`` and errors
    open          ``await open(config, n, first)``: ``n`` desktops named from ``first`` on;
                  raises ``ConfigError`` (bad options, not available here) or ``DesktopError``
    options       the pydantic model of its options (``DesktopConfig.options``); unknown names
                  are refused (``extra="forbid"``), see :meth:`check_options`
    capabilities  ``capabilities(options) -> Capabilities``
    support       ``support(options, desktops) -> BackendSupport``: what it offers on this
                  host for ``desktops`` desktops at once; raises ``ConfigError`` for a bad
                  option (the preflight calls it before anything of a run is written)
    grader_kind   ``grader_kind(support) -> str | None``: the grader a run records
                  (``osworld`` | ``own`` | ``None`` for no grader)
    warm_up       ``warm_up(config, evaluators)``: an async context manager entered for the
                  batch before its desktops open (templates to fork them from), or ``None``
    """

    name: str
    summary: str
    open: Opener
    options: type[BaseModel]
    capabilities: Callable[[Mapping[str, Any]], Capabilities]
    support: Callable[[Mapping[str, Any], int], BackendSupport]
    grader_kind: Callable[[BackendSupport], str | None] = lambda support: None
    warm_up: (
        Callable[[DesktopConfig, Sequence[dict]], contextlib.AbstractAsyncContextManager] | None
    ) = None

    def check_options(self, options: Mapping[str, Any]) -> BaseModel:
        """``options`` as the backend's options model. Raises ``ConfigError`` naming the options
        it does not know (with the allowed names) or the first wrong value (field, error, the
        value given), each with the fix. The registry calls it before a backend's ``open``,
        ``support`` or ``warm_up`` (:func:`check_options`), so a backend need not."""
        from pydantic import ValidationError

        allowed = self.options.model_fields
        unknown = set(options) - set(allowed)
        if unknown:
            raise ConfigError(
                f"desktop options {sorted(unknown)} are not {self.name}-backend options; "
                f"allowed: {sorted(allowed)} (fix: --desktop-option KEY=VALUE, or "
                f"LEGATO_BACKEND_OPTIONS, with one of those KEYs)"
            )
        try:
            return self.options.model_validate(dict(options))
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(p) for p in error["loc"])
            raise ConfigError(
                f"desktop option {field!r} of the {self.name} backend: {error['msg']}, got "
                f"{error.get('input')!r} (fix: --desktop-option {error['loc'][0]}=JSON of "
                f"that type)"
            ) from None


_REGISTRY: dict[str, BackendSpec] = {}


def register(spec: BackendSpec, *, replace: bool = False) -> BackendSpec:
    """Add ``spec`` under ``spec.name``; returns it. Raises ``ValueError`` when the name is
    taken (``replace=True`` replaces it: a test's backend, a reload)."""
    if spec.name in _REGISTRY and not replace and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"desktop backend {spec.name!r} is registered already")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove backend ``name`` (a test's own backend, when the test ends); no error if absent."""
    _REGISTRY.pop(name, None)


def _load_builtin(name: str) -> None:
    module = BUILTIN.get(name)
    if module is not None and name not in _REGISTRY:
        importlib.import_module(module, __package__)


_IMPORTED: set[str] = set()  # the modules of MODULES_ENV imported so far


def _load_env_modules() -> None:
    """Import each module named by :data:`MODULES_ENV` not imported yet (it registers its
    backends). Raises ``ConfigError`` naming a module that does not import."""
    for module in os.environ.get(MODULES_ENV, "").split(","):
        module = module.strip()
        if not module or module in _IMPORTED:
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure of a plugin: say which
            raise ConfigError(
                f"{MODULES_ENV}: module {module!r} does not import: {type(exc).__name__}: {exc} "
                f"(fix: put its directory on PYTHONPATH, or remove it from {MODULES_ENV})"
            ) from exc
        _IMPORTED.add(module)


def _entry_points() -> list:
    from importlib.metadata import entry_points

    return [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in BUILTIN]


def _load_entry_point(name: str) -> None:
    """Load the entry point ``name`` of :data:`ENTRY_POINT_GROUP`, if there is one: importing
    its module registers the backend; a :class:`BackendSpec` it names is registered here.
    Raises ``ConfigError`` naming the entry point when it does not load."""
    for ep in _entry_points():
        if ep.name != name or name in _REGISTRY:
            continue
        try:
            loaded = ep.load()
        except Exception as exc:  # noqa: BLE001 - any failure of a plugin: say which
            raise ConfigError(
                f"backend {name!r} (entry point {ep.value!r} of group {ENTRY_POINT_GROUP}) does "
                f"not load: {type(exc).__name__}: {exc} (fix: reinstall its package)"
            ) from exc
        if isinstance(loaded, BackendSpec):
            register(loaded)


def _load(name: str) -> None:
    """Make backend ``name`` registered if some source has it: built in, then the modules of
    :data:`MODULES_ENV`, then the entry points (each looked at only while it is missing)."""
    _load_builtin(name)
    if name not in _REGISTRY:
        _load_env_modules()
    if name not in _REGISTRY:
        _load_entry_point(name)


def names() -> tuple[str, ...]:
    """Every backend's name: the built-in ones, then those registered since (the modules of
    :data:`MODULES_ENV` imported), then the entry points' not loaded yet, in order."""
    for name in BUILTIN:
        _load_builtin(name)
    _load_env_modules()
    registered = tuple(BUILTIN) + tuple(name for name in _REGISTRY if name not in BUILTIN)
    plugins = tuple(dict.fromkeys(ep.name for ep in _entry_points() if ep.name not in _REGISTRY))
    return registered + plugins


def get(name: str) -> BackendSpec:
    """The backend ``name`` (built in, registered, or a plugin's: :data:`MODULES_ENV`,
    :data:`ENTRY_POINT_GROUP`). Raises ``ConfigError`` naming the known backends, or a plugin
    that does not load."""
    _load(name)
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ConfigError(
            f"desktop.backend: unknown backend {name!r} (use one of: {', '.join(names())}; "
            f"a backend of your own: {MODULES_ENV}=MODULE or an entry point of group "
            f"{ENTRY_POINT_GROUP}, docs/backends.md)"
        )
    return spec


def check_options(name: str, options: Mapping[str, Any] | None) -> BaseModel:
    """Backend ``name``'s ``options`` as its options model (:meth:`BackendSpec.check_options`):
    the one check every way in takes (``open_desktops``, ``warm_up``, ``backend_support``:
    collect's preflight and ``legato tasks check``) before the backend's own code runs and
    before anything of a run is written. Raises ``ConfigError`` naming the option, the backend
    and the fix (or the unknown backend)."""
    return get(name).check_options(dict(options or {}))


def capabilities(name: str, options: Mapping[str, Any] | None = None) -> Capabilities:
    """:class:`Capabilities` of backend ``name`` with ``options``; ``ConfigError`` as :func:`get`."""
    return get(name).capabilities(dict(options or {}))


def early_hook(name: str) -> Callable[[dict[str, Any]], list] | None:
    """``templates_for(options)`` of backend ``name``'s early hook (:data:`EARLY`), or
    ``None`` for a backend with none (or an unknown name)."""
    module = EARLY.get(name)
    if module is None:
        return None
    return importlib.import_module(module, __package__).templates_for
