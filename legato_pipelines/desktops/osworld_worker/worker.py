"""The ``osworld`` backend's worker: one OSWorld ``DesktopEnv`` driven over JSON lines.

Runs under the OSWorld interpreter (``legato osworld install``), never the project's: it
imports only the standard library and ``desktop_env`` (and what desktop_env itself depends
on). The backend starts it as ``<osworld-python> -I worker.py`` in an empty working directory
with a clean environment (docs/osworld.md §8: ``dotenv.load_dotenv()`` runs at import and would
read a ``.env`` from the working directory or a folder above the package; it is also turned
off with ``PYTHON_DOTENV_DISABLED=1``).

Protocol: one JSON object per line on stdin, one answer per line on stdout (the real stdout
is kept for the protocol; anything desktop_env prints goes to stderr)::

    -> {"id": 1, "op": "start", "provider": "docker", "screen": [1920, 1080], "cache_dir": "/abs", ...}
    <- {"id": 1, "ok": true, "result": {...}}
    <- {"id": 1, "ok": false, "error": {"kind": "setup|vm|evaluator|transport|protocol", "message": "..."}}

Operations (``result`` shapes):
  plan      the DesktopEnv keyword arguments ``start`` would use (nothing is constructed)
  preload   import desktop_env (its lazy evaluator packages first) before ``start`` is possible,
            e.g. while the desktop it will drive is still starting; {import_s, gc_frozen}
  warm      {evaluators: [task evaluator objects]}: import the metric and getter modules they
            name now (a template, for the workers it forks later); a name that does not import
            is skipped (that task's setup says why); {import_s, names, failed, new_modules,
            modules}
  start     construct DesktopEnv once (boots the VM); {vm, screen:[w,h], import_s, start_s}
  reset     {task_config, fast, domain?, kill?}: fast reset (kill the task's apps, verify, restore the
            baseline HOME) or snapshot revert, then the task's own setup through
            ``DesktopEnv.reset`` (which no longer reverts); {kind: fast|revert, revert_s, clean_s,
            setup_s, setup_failures: [{step, type, exit_status, error}] (setup_facts.py)}
  setup     {task_config}: only the task's setup (``DesktopEnv.reset`` with nothing to revert),
            on a desktop the caller has reset (the local backend's OSWorld grader);
            {setup_s, setup_failures}
  observe   {size?: [w, h], codecs?}: {png: base64}; at the model's size when given (resized
            here, in the worker's process, by the project's ``images.resized_png``, when this
            interpreter's Pillow and imagecodecs are the collector's versions, ``codecs``:
            ``images.png_codecs()``)
  step      {code, pause?}: ``DesktopEnv.step(code, pause)`` (pause 0 unless given);
            {done, info, returncode, error, output} (``output``: the code's stdout tail)
  evaluate  {last_action_fail}: ``DesktopEnv.evaluate()``; {reward, error, notes,
            postconfig_failures}. An exception from the evaluator is a reward 0 with its reason,
            not a failure; ``notes`` are facts about the files the metrics were given
            (``osworld_format/file_notes.py``); ``postconfig_failures`` the postconfig's steps
            OSWorld carries on after, a window step that matched no window included
            (``setup_facts.py``).
  close     ``DesktopEnv.close()`` (stops the VM), then the worker exits.
  fork      {socket, env, cwd, log_path, confine?}: only on a worker whose DesktopEnv is not started
            (typically a "template" that ran ``preload``): ``os.fork()``; the child starts a
            new session, appends its stderr to ``log_path``, changes to ``cwd``, takes ``env``
            as its whole environment, connects to the Unix socket ``socket`` (where the client
            listens), writes ``{"pid": <pid>}`` and serves this protocol there with a new
            worker, never returning to the template's requests; {pid}. The template reaps its
            children (a SIGCHLD handler, so their CPU counts in its RUSAGE_CHILDREN).
            ``confine`` ({uid, gid, writable, network}): the child is pid 1 of a pid
            namespace of its own and confines itself (``confine.py``: mount namespace, user
            ``uid``, no capability; writable: ``cwd`` and ``writable``; ``network`` ``own``:
            a network namespace the collector connects to its desktop's ports) after
            connecting, before it says hello with its host pid.

``worker.py --confine JSON`` (a spawned worker, the same JSON as ``confine``): the worker
forks into a pid namespace of its own and confines itself before reading its first request.
A confined worker cannot see its collector's pid: it ends when its protocol's input hangs up
(:func:`end_with_input`) rather than by the collector's pidfd.

Silent failures of DesktopEnv become errors here (docs/osworld.md §8): a dead server before
reset/step/evaluate (``vm``: probed with a short timeout instead of DesktopEnv's 20 x 5 s
retries), a screenshot of ``None`` (``vm``), a setup that returned False (``setup``), an
action the server never answered (``vm``). Setup steps that raise are ``setup``. The
backend puts a deadline on every request and kills the worker when one passes.
"""

from __future__ import annotations

import ast
import base64
import gc
import importlib
import importlib.machinery
import importlib.util
import json
import os
import select
import signal
import struct
import sys
import threading
import time
import traceback
import types
import urllib.error
import urllib.request

#: Providers ``DesktopEnv.__init__`` accepts; the first group starts "clean" (docs/osworld.md §8).
CLEAN_START = ("docker", "aws", "gcp", "azure", "aliyun", "volcengine")
KNOWN_PROVIDERS = CLEAN_START + ("vmware", "virtualbox")
PROBE_TIMEOUT_S = 5.0


def _load_by_path(relative: str, name: str):
    """A standard-library-only module of the package (``relative`` to ``legato_pipelines/``),
    loaded by its path: this interpreter cannot import the project's package."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(name, os.path.join(package, relative))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_domains():
    """``desktops/domains.py`` (standard library only)."""
    return _load_by_path(os.path.join("desktops", "domains.py"), "legato_desktop_domains")


_domains = _load_domains()
#: ``osworld_format/file_notes.py``: facts about the files OSWorld's metrics compare.
_file_notes = _load_by_path(os.path.join("osworld_format", "file_notes.py"), "legato_file_notes")
#: ``images.py``: the one resize of a screenshot to the model's size (``model_png``).
_images = _load_by_path("images.py", "legato_images")
#: ``desktops/reaping.py``: the SIGCHLD handler the fork templates share.
_reaping = _load_by_path(os.path.join("desktops", "reaping.py"), "legato_reaping")
#: ``desktops/osworld_worker/confine.py``: the namespaces and user a grading worker runs in.
_confine = _load_by_path(os.path.join("desktops", "osworld_worker", "confine.py"), "legato_confine")
DOMAIN_PROCESSES = _domains.DOMAIN_PROCESSES
BASELINE_DIR = _domains.BASELINE_DIR
baseline_script = _domains.baseline_script
fast_reset_script = _domains.fast_reset_script


class WorkerError(Exception):
    """A request failed; ``kind`` is the failure kind the backend records."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# -- lazy evaluator packages -----------------------------------------------------------------------


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


# -- transport ------------------------------------------------------------------------------------


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


# -- the worker ------------------------------------------------------------------------------------


class Worker:
    """Owns one DesktopEnv. Methods take the request dict and return the result dict."""

    def __init__(self) -> None:
        self.env = None
        self.request: dict = {}
        self.provider = None
        self.vm_token: str | None = None
        self.base_url = ""
        self.baseline_ready = False
        self.last_execute: list = []
        self.eval_notes: list[str] = []
        self.facts = None  # setup_facts.SetupFacts, once DesktopEnv is there
        self.protocol: tuple = ()  # serve()'s (inp, out): a forked child closes them
        #: the collector this worker serves (its parent, or a fork's socket peer): watched
        #: from ``start`` on (:func:`end_with_client`); a template never starts, so it keeps
        #: one thread (forks copy only the forking thread)
        self.client_pid = os.getppid()  # 0 in a confined worker: not in its pid namespace
        self.client_is_parent = True
        self._watching = False
        #: a VM provider's DesktopEnv is being made: an exit now would leave its VM running,
        #: so the collector's end is only noted (``_orphaned``) and ``start`` ends the worker
        self._making_vm = False
        self._orphaned = False
        self._orphan_lock = threading.Lock()
        self._pid_namespaces = None  # a template forking confined workers (op fork)

    # -- start ---------------------------------------------------------------------------------

    def plan(self, req: dict) -> dict:
        """DesktopEnv keyword arguments for a ``start`` request (a pure function of it)."""
        provider = req.get("provider") or "docker"
        if provider != "local" and provider not in KNOWN_PROVIDERS:
            raise WorkerError(
                "protocol",
                f"provider {provider!r} is not one of DesktopEnv's {list(KNOWN_PROVIDERS)} or 'local'",
            )
        screen = req.get("screen") or [1920, 1080]
        cache_dir = req.get("cache_dir")
        if not cache_dir or not os.path.isabs(cache_dir):
            raise WorkerError("protocol", f"cache_dir must be an absolute path, got {cache_dir!r}")
        kwargs = {
            # the local provider stands in for a clean-starting one (docker's lifecycle)
            "provider_name": "docker" if provider == "local" else provider,
            "region": req.get("region"),
            "path_to_vm": req.get("path_to_vm"),
            "snapshot_name": req.get("snapshot_name") or "init_state",
            "action_space": "pyautogui",
            "cache_dir": cache_dir,
            "screen_size": (int(screen[0]), int(screen[1])),
            "headless": bool(req.get("headless", True)),
            "require_a11y_tree": False,
            "require_terminal": False,
            "os_type": req.get("os_type") or "Ubuntu",
            "enable_proxy": bool(req.get("enable_proxy", False)),
            "client_password": req.get("client_password") or "",
        }
        if provider == "local":
            if not req.get("vm_url"):
                raise WorkerError(
                    "protocol", "provider 'local' needs vm_url (the desktop server's URL)"
                )
            kwargs["path_to_vm"] = req["vm_url"]
        return {"kwargs": {**kwargs, "screen_size": list(kwargs["screen_size"])}}

    def preload(self, req: dict) -> dict:
        """Import ``desktop_env.desktop_env`` now (~1.4 s on 2 cores), so that ``start`` finds
        it imported; nothing is constructed. ``{import_s, gc_frozen}``: seconds of the import;
        objects out of the cyclic collector's reach (``gc.freeze()``: the template's, in a
        worker forked from one; 0 in a spawned worker)."""
        t0 = time.perf_counter()
        install_lazy_evaluators()
        import desktop_env.desktop_env  # noqa: F401

        return {"import_s": time.perf_counter() - t0, "gc_frozen": gc.get_freeze_count()}

    def warm(self, req: dict) -> dict:
        """Import the metric and getter modules that ``req["evaluators"]`` (OSWorld evaluator
        objects, as in a task's ``evaluator``) name, through the lazy packages
        (:func:`install_lazy_evaluators`). On the graders' template, before its first fork:
        every worker then comes with pandas, openpyxl and the metric modules imported instead
        of importing them at its first setup (~0.45 s of CPU per worker for the local suite's
        tasks; issue 18). Failures are counted, not
        raised: :func:`check_evaluator` reports them for the task that needs the module.
        ``{import_s, names, failed, new_modules, modules}``: ``new_modules`` how many modules
        this call imported (0 in a worker forked after a template's ``warm``), ``modules``
        the evaluator modules imported now (``desktop_env.evaluators.metrics.table``, ...)."""
        evaluators = req.get("evaluators")
        if not isinstance(evaluators, list):
            raise WorkerError("protocol", "warm: evaluators must be a list of evaluator objects")
        t0 = time.perf_counter()
        before = len(sys.modules)
        install_lazy_evaluators()
        names = {
            name
            for evaluator in evaluators
            if isinstance(evaluator, dict)
            for name in evaluator_names({"evaluator": evaluator})
        }
        failed = 0
        for package, name in sorted(names):
            try:
                evaluator_function(package, name)
            except Exception:  # noqa: BLE001 - the task that needs it reports it (check_evaluator)
                failed += 1
        return {
            "import_s": time.perf_counter() - t0,
            "names": len(names),
            "failed": failed,
            "new_modules": len(sys.modules) - before,
            "modules": sorted(
                m
                for m in list(sys.modules)
                if m.startswith(
                    ("desktop_env.evaluators.metrics.", "desktop_env.evaluators.getters.")
                )
            ),
        }

    def start(self, req: dict) -> dict:
        if self.env is not None:
            raise WorkerError("protocol", "start: the DesktopEnv is already started")
        kwargs = self.plan(req)["kwargs"]
        kwargs["screen_size"] = tuple(kwargs["screen_size"])
        if not self._watching:
            if not self.client_pid:  # confined: the collector is out of sight
                end_with_input(self.protocol[0].fileno(), self.client_gone)
            else:
                if self.client_is_parent and os.getppid() != self.client_pid:
                    self.client_gone()  # the collector ended before the watch began
                end_with_client(self.client_pid, self.client_gone)
            self._watching = True
        self.request = req
        t0 = time.perf_counter()
        install_lazy_evaluators()
        import desktop_env.desktop_env as de

        import_s = time.perf_counter() - t0
        if req.get("provider") == "local":
            self._use_local_provider(de, req)
        t1 = time.perf_counter()
        self._making_vm = req.get("provider") != "local"  # local: nothing of ours to leak
        try:
            self.env = de.DesktopEnv(**kwargs)
        except Exception as exc:
            self._vm_made()
            hint = ""
            if req.get("provider", "docker") == "docker" and "docker" in _describe(exc).lower():
                hint = (
                    " (is a Docker engine running here? OSWorld's docker provider needs one;"
                    " without VMs use --backend local or --backend fake)"
                )
            raise WorkerError(
                "vm", f"DesktopEnv could not start the VM: {_describe(exc)}{hint}"
            ) from None
        self._vm_made()
        self.provider = self.env.provider
        self._watch_controllers()
        self.base_url = self.env.controller.http_server
        self._probe()
        screen = self.env.vm_screen_size
        if screen and (screen["width"], screen["height"]) != kwargs["screen_size"]:
            # the image fixes the screen (docker: 1920x1080); the setup placeholders
            # {SCREEN_WIDTH}/{SCREEN_HEIGHT} must use the real one (kept across reverts)
            self.env.screen_width, self.env.screen_height = screen["width"], screen["height"]
            self.env.setup_controller.screen_width = screen["width"]
            self.env.setup_controller.screen_height = screen["height"]
        self._make_baseline()
        return {
            "vm": f"{self.env.vm_ip}:{self.env.server_port}:{self.env.chromium_port}:"
            f"{self.env.vnc_port}:{self.env.vlc_port}",
            "server": self.base_url,
            "screen": [int(screen["width"]), int(screen["height"])] if screen else None,
            "import_s": import_s,
            "start_s": time.perf_counter() - t1,
        }

    def client_gone(self) -> None:
        """The collector ended (:func:`end_with_client`'s thread, or ``start``): SIGTERM to
        this worker (:func:`install_terminate` stops the VM and exits), unless a VM
        provider's DesktopEnv is being made: then ``start`` stops it once it is there."""
        with self._orphan_lock:
            if self._making_vm:
                self._orphaned = True
                return
        os.kill(os.getpid(), signal.SIGTERM)

    def _vm_made(self) -> None:
        """DesktopEnv's construction ended (made or failed): end the worker now if the
        collector ended meanwhile."""
        with self._orphan_lock:
            self._making_vm = False
            orphaned = self._orphaned
        if orphaned:
            os.kill(os.getpid(), signal.SIGTERM)

    def _use_local_provider(self, de, req: dict) -> None:
        """Swap the factory DesktopEnv calls for one returning the project-local provider."""
        module = load_sibling("provider_local")
        self.vm_token = os.environ.get(req.get("vm_token_env") or "LEGATO_OSWORLD_VM_TOKEN") or None
        url = req["vm_url"].rstrip("/")
        ports = req.get("ports") or {}
        if self.vm_token:
            add_vm_token(url, self.vm_token)
        # DesktopEnv uses the name imported into desktop_env.desktop_env (docs/osworld.md §8).
        de.create_vm_manager_and_provider = lambda name, region, use_proxy=False: (
            module.LocalVMManager(url),
            module.LocalProvider(url, self.vm_token, **ports),
        )

    def _watch_controllers(self) -> None:
        """Record what ``execute_python_command`` and ``setup`` return (DesktopEnv drops it);
        run setups step by step, keeping the failures OSWorld carries on after as facts
        (``setup_facts.py``)."""
        env = self.env
        execute = env.controller.execute_python_command
        controller = env.setup_controller
        setup = controller.setup
        if self.facts is None:
            import desktop_env.controllers.setup as setup_module

            self.facts = load_sibling("setup_facts").SetupFacts(setup_module)

        def watched_execute(command, _execute=execute):
            result = _execute(command)
            self.last_execute.append(result)
            return result

        def watched_setup(config, use_proxy=False, _setup=setup, _controller=controller):
            ok = self.facts.run(_setup, _controller, config, use_proxy)
            if not ok:
                raise WorkerError(
                    "setup", "SetupController.setup returned False (the VM server is unreachable)"
                )
            return ok

        env.controller.execute_python_command = watched_execute
        env.setup_controller.setup = watched_setup

    def _watch_metrics(self) -> None:
        """Note facts about what OSWorld's metrics are given (an xlsx whose formulas hold no
        cached values: ``file_notes``) in :attr:`eval_notes`; the metrics run unchanged and
        their scores are returned as they are (``DesktopEnv.evaluate`` stays the authority)."""
        env = self.env

        def watched(metric):
            def call(*args, **kwargs):
                for value, role in zip(args, ("result", "expected"), strict=False):
                    try:
                        self.eval_notes.extend(_file_notes.file_notes(value, role))
                    except Exception:  # a note must never change the grade
                        traceback.print_exc(file=sys.stderr)
                return metric(*args, **kwargs)

            return call

        metric = getattr(env, "metric", None)
        if isinstance(metric, list):
            env.metric = [watched(m) for m in metric]
        elif callable(metric):
            env.metric = watched(metric)

    def _probe(self) -> None:
        """Whether the VM's server answers with its display up, before each setup, action and
        evaluation: ``GET /cursor_position`` (OSWorld's server asks pyautogui, a local desktop
        server asks X once: it fails when the display is gone, not only when the server is).
        Not ``/screenshot``: that made the server grab and encode a full-size PNG only to be
        thrown away (on a local desktop ~15-50 ms of its CPU, twice per attempt)."""
        http_probe(self.base_url + "/cursor_position", self.vm_token)

    def _run_in_vm(self, script: str, timeout: float = 60.0) -> dict:
        return http_post_json(
            self.base_url + "/setup/execute",
            {"command": ["bash", "-c", script], "shell": False},
            self.vm_token,
            timeout,
        )

    def _vm_fast_reset(self) -> bool:
        """True: fast resets run in the VM (kill + HOME baseline); False: the local desktop
        server's own ``/legato/reset`` (provider local, ``fast_mode`` ``server``)."""
        return not (
            self.request.get("provider") == "local" and self.request.get("fast_mode") != "vm"
        )

    def _make_baseline(self) -> None:
        if not self._vm_fast_reset():
            self.baseline_ready = True  # the local desktop server keeps its own baseline
            return
        out = self._run_in_vm(baseline_script(self.request.get("baseline_dir") or BASELINE_DIR))
        self.baseline_ready = out.get("returncode") == 0

    # -- reset ---------------------------------------------------------------------------------

    def reset(self, req: dict) -> dict:
        env = self._env()
        task = req.get("task_config")
        if not isinstance(task, dict) or "id" not in task:
            raise WorkerError(
                "protocol", "reset: task_config must be an OSWorld task object with an 'id'"
            )
        fast = bool(req.get("fast")) and self.baseline_ready
        t0 = time.perf_counter()
        revert_s = clean_s = 0.0
        kind = "fast"
        detail: dict = {}
        if fast:
            try:
                self._probe()
                kill = req.get("kill") or DOMAIN_PROCESSES.get(req.get("domain") or "", ())
                detail = self._fast_clean(list(kill))
            except WorkerError as exc:
                detail = {"fast_error": str(exc)}
                fast = False
            clean_s = time.perf_counter() - t0
        if not fast:
            kind = "revert"
            t1 = time.perf_counter()
            try:
                env._revert_to_snapshot()
                env._start_emulator()
            except Exception as exc:
                raise WorkerError("vm", f"snapshot revert failed: {_describe(exc)}") from None
            self._watch_controllers()
            self.base_url = env.controller.http_server
            self._probe()
            self._make_baseline()
            revert_s = time.perf_counter() - t1
        env.is_environment_used = False  # the VM is clean now: reset must not revert again
        self._probe()
        check_evaluator(task)
        t2 = time.perf_counter()
        if self.facts is not None:
            self.facts.failures = []
        try:
            obs = env.reset(task_config=task)
        except WorkerError:
            raise
        except Exception as exc:
            raise WorkerError("setup", f"task setup failed: {_describe(exc)}") from None
        setup_failures = list(self.facts.failures) if self.facts is not None else []
        if obs.get("screenshot") is None:
            raise WorkerError(
                "vm", "no screenshot after the task's setup (the VM server stopped answering)"
            )
        self._watch_metrics()
        return {
            "kind": kind,
            "revert_s": revert_s,
            "clean_s": clean_s,
            "setup_s": time.perf_counter() - t2,
            "reset_s": time.perf_counter() - t0,
            "setup_failures": setup_failures,
            **detail,
        }

    def setup(self, req: dict) -> dict:
        """The task's own setup on a desktop somebody else has just reset (the local backend's
        grader: it owns reset, observe and step): ``DesktopEnv.reset`` with nothing to revert,
        so only OSWorld's ``SetupController`` runs the task's ``config`` steps.
        ``{setup_s, setup_failures}``; raises ``WorkerError`` as :meth:`reset` does."""
        env = self._env()
        task = req.get("task_config")
        if not isinstance(task, dict) or "id" not in task:
            raise WorkerError(
                "protocol", "setup: task_config must be an OSWorld task object with an 'id'"
            )
        env.is_environment_used = False  # the caller reset the desktop: never revert here
        self._probe()
        check_evaluator(task)
        t0 = time.perf_counter()
        if self.facts is not None:
            self.facts.failures = []
        # DesktopEnv.reset ends by taking an observation (a full-size GET /screenshot) that
        # nobody here reads: the caller observes on its own. Skipped for this call only.
        env._get_obs = dict
        try:
            env.reset(task_config=task)
        except WorkerError:
            raise
        except Exception as exc:
            raise WorkerError("setup", f"task setup failed: {_describe(exc)}") from None
        finally:
            del env._get_obs
        env.is_environment_used = False
        self._watch_metrics()
        return {
            "setup_s": time.perf_counter() - t0,
            "setup_failures": list(self.facts.failures) if self.facts is not None else [],
        }

    def load_task(self, req: dict) -> dict:
        """The task of an attempt that another worker set up, without running its setup
        (op ``load_task``): DesktopEnv's task and evaluator info (``_set_task_info``) and its
        setup controller's cache folder, as ``DesktopEnv.reset`` sets them before the setup
        steps. A local desktop's grader grades once per worker (docs/sandbox.md §6), so a
        second ``evaluate`` of the same attempt runs in a fresh worker that loads the task
        this way. ``{}``; raises ``WorkerError("protocol")`` for a task object without ``id``
        and ``WorkerError("setup")`` for an evaluator DesktopEnv cannot resolve."""
        env = self._env()
        task = req.get("task_config")
        if not isinstance(task, dict) or "id" not in task:
            raise WorkerError(
                "protocol", "load_task: task_config must be an OSWorld task object with an 'id'"
            )
        check_evaluator(task)
        try:
            env._set_task_info(task)
            env.setup_controller.reset_cache_dir(env.cache_dir)
        except Exception as exc:
            raise WorkerError("setup", f"task load failed: {_describe(exc)}") from None
        env.action_history.clear()
        env.is_environment_used = False
        self._watch_metrics()
        return {}

    def _fast_clean(self, kill: list[str]) -> dict:
        """Kill the task's apps, verify, restore the clean HOME. Raises ``WorkerError`` if not clean."""
        if not self._vm_fast_reset():  # the local desktop server's own /legato/reset fast path
            try:
                detail = self.provider.fast_reset()
            except Exception as exc:
                raise WorkerError("vm", f"fast reset failed: {_describe(exc)}") from None
            if detail.get("kind") != "fast":
                raise WorkerError(
                    "vm", f"the desktop server did a {detail.get('kind')} reset instead"
                )
            return {}
        baseline = self.request.get("baseline_dir") or BASELINE_DIR
        same_display = self.request.get("provider") == "local"
        out = self._run_in_vm(fast_reset_script(kill, baseline, same_display=same_display))
        if out.get("returncode") != 0:
            raise WorkerError(
                "vm", f"fast reset in the VM failed: {(out.get('output') or '').strip()[:300]}"
            )
        return {}

    # -- acting, observing, grading -------------------------------------------------------------

    def observe(self, req: dict) -> dict:
        png = self._env().render()
        if png is None:
            raise WorkerError("vm", "no screenshot (the VM server stopped answering)")
        if req.get("size") is not None:
            png = model_png(png, req["size"], req.get("codecs"))
        return {"png": base64.b64encode(png).decode("ascii")}

    def step(self, req: dict) -> dict:
        env = self._env()
        code = req.get("code")
        if not isinstance(code, str) or not code:
            raise WorkerError("protocol", "step: code must be pyautogui code or WAIT/DONE/FAIL")
        pause = float(req.get("pause") or 0.0)
        if code not in ("WAIT", "DONE", "FAIL"):
            self._probe()
        self.last_execute.clear()
        try:
            obs, _reward, done, info = env.step(code, pause=pause)
        except Exception as exc:
            raise WorkerError("vm", f"step failed: {_describe(exc)}") from None
        result: dict = {"done": bool(done), "info": info, "returncode": None, "error": None}
        if code not in ("WAIT", "DONE", "FAIL"):
            answer = self.last_execute[-1] if self.last_execute else None
            if answer is None:
                raise WorkerError(
                    "vm", "the VM server did not run the action (no answer from /execute)"
                )
            result["returncode"] = answer.get("returncode")
            result["error"] = (answer.get("error") or "")[-2000:] or None
            result["output"] = (answer.get("output") or "")[-2000:] or None
        if obs.get("screenshot") is None:
            raise WorkerError(
                "vm", "no screenshot after the action (the VM server stopped answering)"
            )
        return result

    def evaluate(self, req: dict) -> dict:
        env = self._env()
        if getattr(env, "evaluator", None) is None:
            raise WorkerError("protocol", "evaluate before reset")
        self._probe()
        if req.get("last_action_fail"):
            env.step("FAIL", pause=0)  # OSWorld's FAIL: infeasible scores 1, other metrics 0
        t0 = time.perf_counter()
        self.eval_notes = []
        if self.facts is not None:  # the postconfig runs through the watched setup controller
            self.facts.failures, self.facts.postconfig = [], True
        try:
            reward = float(env.evaluate())
            error = None
        except WorkerError:
            raise
        except Exception as exc:
            reward, error = 0.0, _describe(exc)
            traceback.print_exc(file=sys.stderr)  # the grader's log keeps where it raised
        finally:
            if self.facts is not None:
                self.facts.postconfig = False
        notes = list(dict.fromkeys(self.eval_notes))
        return {
            "reward": reward,
            "error": error,
            "notes": notes,
            "postconfig_failures": list(self.facts.failures) if self.facts is not None else [],
            "eval_s": time.perf_counter() - t0,
        }

    def fork(self, req: dict) -> dict:
        """A new worker forked from this one (op ``fork``, the module docstring). The child
        never returns from here: it serves its socket, then ``os._exit``. Raises
        ``WorkerError("protocol")`` when this worker's DesktopEnv is started or a field is
        missing."""
        if self.env is not None:
            raise WorkerError("protocol", "fork: only a worker without a started DesktopEnv forks")
        missing = [f for f in ("socket", "env", "cwd", "log_path") if not req.get(f)]
        if missing or not isinstance(req["env"], dict):
            raise WorkerError(
                "protocol", f"fork needs socket, env (a dict), cwd and log_path; missing {missing}"
            )
        signal.signal(
            signal.SIGCHLD, _reaping.reap_children
        )  # before the fork: a child may end at once
        threads = len(os.listdir("/proc/self/task"))  # native ones too (BLAS, an import's)
        if threads > 1:  # the child could inherit a lock another thread held
            raise WorkerError(
                "protocol", f"fork: this worker runs {threads} threads; only one may fork"
            )
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # desktop_env's objects: never scanned (and copied) by a child's collections
        confine = req.get("confine")
        if confine:
            if self._pid_namespaces is None:
                self._pid_namespaces = _confine.PidNamespaces()
            self._pid_namespaces.before_fork()
        pid = -1
        try:
            pid = os.fork()
        finally:
            if confine and pid != 0:
                self._pid_namespaces.after_fork()
        if pid == 0:
            _forked_child(req, self.protocol)  # never returns
        return {"pid": pid}

    def close(self, req: dict) -> dict:
        env, self.env = self.env, None
        if env is not None:
            env.close()
        return {}

    def _env(self):
        if self.env is None:
            raise WorkerError("protocol", "the DesktopEnv is not started (send start first)")
        return self.env


def model_png(png: bytes, size, codecs: str | None = None) -> bytes:
    """The VM's screenshot at the model's ``size`` ([width, height]), resized here in the
    worker's process by the project's own ``images.resized_png`` (what the collector would
    do: decode, Pillow's default resize, encode). The VM's own bytes when it already has that
    size, or when this interpreter's ``images.png_codecs()`` (Pillow's and imagecodecs'
    versions, ``none`` for a missing one) is not ``codecs`` (the collector's: the same
    versions make the same bytes) or no ``codecs`` was sent, so the collector resizes it. An
    OSWorld venv usually differs (desktop-env pins its own Pillow; its numpy 1.26 pin keeps
    the collector's imagecodecs out), so the collector resizes VM screenshots."""
    import io

    try:
        width, height = (int(v) for v in size)
    except (TypeError, ValueError):
        raise WorkerError(
            "protocol", f"observe: size must be [width, height], got {size!r}"
        ) from None
    if codecs is None or _images.png_codecs() != codecs:
        return png
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        if image.size == (width, height):
            return png
        return _images.resized_png(image, (width, height))


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


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 1000 else text[:1000] + "..."


OPS = (
    "plan",
    "preload",
    "warm",
    "start",
    "reset",
    "setup",
    "load_task",
    "observe",
    "step",
    "evaluate",
    "close",
    "fork",
)


def _forked_child(req: dict, protocol: tuple) -> None:
    """The child of op ``fork``: detach from the template (session, descriptors, signals),
    take the request's environment and directory, connect to ``req["socket"]`` and serve a
    new :class:`Worker` there; ``os._exit`` at the end, whatever happens."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # the parent's protocol descriptors: the parent's client sees EOF when the parent
        # ends, not when its last child does (the stream objects stay on the stack, unused)
        for fd in {stream.fileno() for stream in protocol} - {0, 1, 2}:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = os.open(req["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(log, 2)
        os.dup2(log, 1)
        os.close(log)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in req["env"].items()})
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(req["socket"])
        pid = os.getpid()
        confine = req.get("confine")
        if confine:  # pid 1 of its own pid namespace: the collector knows its host pid
            pid = _confine.host_pid()
            confined(confine, req["cwd"])
        out = sock.makefile("wb")
        out.write(json.dumps({"pid": pid}).encode() + b"\n")
        out.flush()
        worker = Worker()
        install_terminate(worker)
        # the collector listens on the socket: its pid is the peer's (SO_PEERCRED: pid, uid,
        # gid; 0 for a confined worker, which sees no pid outside its namespace)
        peer = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        worker.client_pid, worker.client_is_parent = peer[0], False
        serve(sock.makefile("rb"), out, worker)
        code = 0
    except BaseException:
        traceback.print_exc(file=sys.stderr)
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(inp, out, worker: Worker | None = None) -> None:
    """Answer requests from ``inp`` (binary lines) on ``out`` until EOF or ``close``."""
    worker = worker or Worker()
    worker.protocol = (inp, out)
    try:
        for line in inp:
            if not line.strip():
                continue
            rid = None
            try:
                req = json.loads(line)
                rid = req.get("id")
                op = req.get("op")
                if op not in OPS:
                    raise WorkerError("protocol", f"unknown op {op!r}; one of {list(OPS)}")
                answer = {"id": rid, "ok": True, "result": getattr(worker, op)(req)}
            except WorkerError as exc:
                answer = {"id": rid, "ok": False, "error": {"kind": exc.kind, "message": str(exc)}}
            except Exception as exc:  # a bug or an unexpected DesktopEnv failure
                traceback.print_exc(file=sys.stderr)
                answer = {
                    "id": rid,
                    "ok": False,
                    "error": {"kind": "vm", "message": _describe(exc)},
                }
            out.write(json.dumps(answer).encode() + b"\n")
            out.flush()
            if answer["ok"] and req.get("op") == "close":
                return
    finally:
        if worker.env is not None:
            try:
                worker.env.close()
            except Exception:
                traceback.print_exc(file=sys.stderr)


def install_terminate(worker: Worker) -> None:
    """SIGTERM (the backend's deadline): stop ``worker``'s VM (``DesktopEnv.close``), then
    exit at once with 128 + the signal.

    Done in the handler rather than by raising: desktop_env has bare ``except:`` clauses (its
    liveness loops) that would swallow a ``SystemExit`` and keep the worker going.
    """

    def terminate(signum, frame):
        try:
            if worker.env is not None:
                worker.env.close()
        except BaseException:
            traceback.print_exc(file=sys.stderr)
        finally:
            os._exit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)


def confined(spec: dict, cwd: str, *, spawned: bool = False) -> None:
    """Confine this worker (pid 1 of a pid namespace of its own) by ``spec`` ({uid, gid,
    writable, network}): ``confine.enter`` with ``cwd`` and ``writable`` as its writable
    paths, in a network namespace of its own when ``network`` is ``own`` (a spawned worker's
    was made with its pid namespace: ``confine.spawned_in_pid_namespace``)."""
    writable = [cwd, *(spec.get("writable") or [])]
    own = spec.get("network") == "own" and not spawned
    _confine.enter(writable, uid=int(spec["uid"]), gid=int(spec["gid"]), own_network=own)


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


def main() -> None:
    """Keep the real stdout for the protocol; everything else printed goes to stderr.

    ``worker.py --names`` prints :func:`installed_names` as one JSON object and exits;
    ``worker.py --preload`` runs op ``preload`` before reading its first request (a template
    started on ``legato``'s first line, ``desktops/early.py``: it imports while the CLI does).
    """
    if sys.argv[1:] == ["--names"]:
        print(json.dumps(installed_names()))
        return
    if sys.argv[1:2] == ["--confine"]:  # before anything reads the collector's pipes
        spec = json.loads(sys.argv[2])
        # the parent waits there, outside, and ends
        _confine.spawned_in_pid_namespace(spec.get("network") == "own")
        confined(spec, os.getcwd(), spawned=True)
        _confine.prctl(_confine.PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    worker = Worker()
    install_terminate(worker)
    import logging

    logging.basicConfig(
        level=os.environ.get("LEGATO_OSWORLD_LOG", "WARNING"),
        stream=sys.stderr,
        format="osworld-worker %(levelname)s %(name)s: %(message)s",
    )
    if sys.argv[1:] == ["--preload"]:  # a template started early: import before the first request
        try:
            worker.preload({})
        except Exception:  # noqa: BLE001 - the first ``preload`` request fails with it again
            pass
    serve(sys.stdin.buffer, out, worker)


if __name__ == "__main__":
    main()
