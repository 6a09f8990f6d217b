"""The worker's ``DesktopEnv``: one per worker process, driven op by op (``plan``, ``preload``,
``warm``, ``start``, ``reset``, ``setup``, ``load_task``, ``observe``, ``step``, ``evaluate``,
``close``: the protocol in ``worker.py``'s docstring), with the fast reset, the checks that
turn DesktopEnv's silent failures into errors, and the screenshot at the model's size.

Loaded under the OSWorld interpreter as a module of the package ``legato_osworld`` that
``worker.py`` makes of this directory (:func:`worker.as_package`): standard library and
``desktop_env`` only, its siblings by relative import.
"""

from __future__ import annotations

import base64
import gc
import io
import os
import signal
import sys
import threading
import time
import traceback

from .worker_evaluators import (
    check_evaluator,
    evaluator_function,
    evaluator_names,
    install_lazy_evaluators,
)
from .worker_process import (
    WorkerError,
    describe,
    end_with_client,
    end_with_input,
    load_by_path,
    load_sibling,
)
from .worker_vm import add_vm_token, http_post_json, http_probe

#: Providers ``DesktopEnv.__init__`` accepts; the first group starts "clean" (docs/osworld.md §8).
CLEAN_START = ("docker", "aws", "gcp", "azure", "aliyun", "volcengine")
KNOWN_PROVIDERS = CLEAN_START + ("vmware", "virtualbox")

_domains = load_by_path(os.path.join("desktops", "domains.py"), "legato_desktop_domains")
#: ``osworld_format/file_notes.py``: facts about the files OSWorld's metrics compare.
_file_notes = load_by_path(os.path.join("osworld_format", "file_notes.py"), "legato_file_notes")
#: ``images.py``: the one resize of a screenshot to the model's size (``model_png``).
_images = load_by_path("images.py", "legato_images")
DOMAIN_PROCESSES = _domains.DOMAIN_PROCESSES
BASELINE_DIR = _domains.BASELINE_DIR
baseline_script = _domains.baseline_script
fast_reset_script = _domains.fast_reset_script


class EnvWorker:
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
            if req.get("provider", "docker") == "docker" and "docker" in describe(exc).lower():
                hint = (
                    " (is a Docker engine running here? OSWorld's docker provider needs one;"
                    " without VMs use --backend local or --backend fake)"
                )
            raise WorkerError(
                "vm", f"DesktopEnv could not start the VM: {describe(exc)}{hint}"
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
                raise WorkerError("vm", f"snapshot revert failed: {describe(exc)}") from None
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
            raise WorkerError("setup", f"task setup failed: {describe(exc)}") from None
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
            raise WorkerError("setup", f"task setup failed: {describe(exc)}") from None
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
            raise WorkerError("setup", f"task load failed: {describe(exc)}") from None
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
                raise WorkerError("vm", f"fast reset failed: {describe(exc)}") from None
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
            raise WorkerError("vm", f"step failed: {describe(exc)}") from None
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
            reward, error = 0.0, describe(exc)
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
