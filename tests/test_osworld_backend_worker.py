"""The osworld worker and backend without a desktop: the real worker process under the OSWorld
venv, its protocol, the DesktopEnv arguments per provider (the Docker provider is tested at
this level only: there is no Docker engine or OSWorld image here), the lazy evaluator
loader, deadlines and dead workers, options, and the ``<`` fix on rendered actions.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from legato_pipelines.actions import Action
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.domains import DOMAIN_PROCESSES, fast_reset_script
from legato_pipelines.desktops.osworld_worker import channel
from legato_pipelines.desktops.osworld_worker import options as osworld_options
from legato_pipelines.errors import ConfigError, DesktopError
from legato_pipelines.harness import render

from .osworld_backend_support import osworld_python


@pytest.fixture(scope="module")
def python() -> str:
    return osworld_python()


def venv_imports(python: str, module: str) -> bool:
    """Whether the OSWorld venv at ``python`` has ``module`` (which recipe it was built with)."""
    probe = f"import importlib.util as u; raise SystemExit(u.find_spec({module!r}) is None)"
    return subprocess.run([python, "-I", "-c", probe]).returncode == 0


async def started_worker(python: str, tmp_path, **env) -> channel.WorkerProcess:
    worker = channel.WorkerProcess(
        python, env=osworld_options.worker_env(env, provider=None), cwd=str(tmp_path), name="t"
    )
    await worker.start()
    return worker


async def test_plan_docker_provider_is_what_desktop_env_gets(python, tmp_path):
    config = DesktopConfig(
        backend="osworld",
        screen_width=1920,
        screen_height=1080,
        options={"osworld_python": python, "cache_dir": str(tmp_path / "c"), "region": "x"},
    )
    requests = osworld_options.plan_desktops(config, 2)
    assert [r["cache_dir"] for r in requests] == [
        str(tmp_path / "c" / "desktop-0"),
        str(tmp_path / "c" / "desktop-1"),
    ]
    worker = await started_worker(python, tmp_path)
    try:
        plan = await worker.call("plan", 30, **requests[0])
    finally:
        await worker.stop()
    assert plan["kwargs"] == {
        "provider_name": "docker",
        "region": "x",
        "path_to_vm": None,
        "snapshot_name": "init_state",
        "action_space": "pyautogui",
        "cache_dir": str(tmp_path / "c" / "desktop-0"),
        "screen_size": [1920, 1080],
        "headless": True,
        "require_a11y_tree": False,
        "require_terminal": False,
        "os_type": "Ubuntu",
        "enable_proxy": False,
        "client_password": "",
    }


def test_the_venv_imports_the_docker_provider(python, tmp_path):
    """The Docker provider's modules (docker SDK, psutil, filelock, tqdm) import in the venv."""
    probe = (
        "from desktop_env.providers.base import Provider, VMManager;"
        "from desktop_env.providers.docker.provider import DockerProvider;"
        "from desktop_env.providers.docker.manager import DockerVMManager;"
        "print(issubclass(DockerProvider, Provider), issubclass(DockerVMManager, VMManager))"
    )
    done = subprocess.run(
        [python, "-I", "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHON_DOTENV_DISABLED": "1", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


@pytest.mark.skipif(
    os.path.exists("/var/run/docker.sock"), reason="a Docker engine is here: start would boot a VM"
)
async def test_docker_start_without_an_engine_is_a_vm_error(python, tmp_path):
    """DesktopEnv's real Docker provider, no engine on this machine: a clear ``vm`` failure
    (``path_to_vm`` given, so the manager never downloads the image)."""
    worker = await started_worker(python, tmp_path, HOME=str(tmp_path))
    try:
        with pytest.raises(DesktopError, match="DesktopEnv could not start the VM") as err:
            await worker.call(
                "start",
                60,
                provider="docker",
                path_to_vm=str(tmp_path / "Ubuntu.qcow2"),
                cache_dir=str(tmp_path / "cache"),
            )
        assert err.value.kind == "vm"
        assert "docker" in str(err.value).lower()
    finally:
        await worker.stop()


async def test_plan_local_stands_in_for_a_clean_start_provider(python, tmp_path):
    worker = await started_worker(python, tmp_path)
    try:
        plan = await worker.call(
            "plan", 30, provider="local", vm_url="http://127.0.0.1:9", cache_dir=str(tmp_path)
        )
        assert plan["kwargs"]["provider_name"] == "docker"
        assert plan["kwargs"]["path_to_vm"] == "http://127.0.0.1:9"
        with pytest.raises(DesktopError, match="absolute") as err:
            await worker.call("plan", 30, provider="docker", cache_dir="cache")
        assert err.value.kind == "transport"
        with pytest.raises(DesktopError, match="nimbus"):
            await worker.call("plan", 30, provider="nimbus", cache_dir=str(tmp_path))
        with pytest.raises(DesktopError, match="unknown op"):
            await worker.call("teleport", 30)
        with pytest.raises(DesktopError, match="not started") as err:
            await worker.call("observe", 30)
        assert worker.alive()  # errors are answers, not crashes
    finally:
        await worker.stop()


def test_lazy_loader_imports_only_the_modules_a_task_names(python, tmp_path):
    worker_py = str(channel.WORKER_SCRIPT)
    probe = f"""
import sys, time, runpy
t0 = time.perf_counter()
w = runpy.run_path({worker_py!r})
w["install_lazy_evaluators"]()
import desktop_env.desktop_env as de
from desktop_env.evaluators import metrics, getters
loaded = lambda: sorted(m.rsplit(".", 1)[1] for m in sys.modules
                        if m.startswith(("desktop_env.evaluators.metrics.", "desktop_env.evaluators.getters.")))
before = loaded()
f = metrics.check_include_exclude
g = getters.get_vm_command_line
print(repr((before, loaded(), f.__module__, g.__module__, metrics.infeasible() is None,
            "torch" in sys.modules, "cv2" in sys.modules, round(time.perf_counter() - t0, 2))))
"""
    env = {"PATH": "/usr/bin:/bin", "PYTHON_DOTENV_DISABLED": "1"}
    done = subprocess.run(
        [python, "-I", "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    before, after, fmod, gmod, infeasible, torch, cv2, seconds = eval(done.stdout.strip())
    assert before == ["utils"]  # controllers/setup.py imports metrics.utils itself
    assert after == ["general", "general", "utils"]  # metrics.general and getters.general
    assert fmod == "desktop_env.evaluators.metrics.general"
    assert gmod == "desktop_env.evaluators.getters.general"
    # cv2 may be there: gymnasium (imported by desktop_env) loads it when installed, as under
    # the full recipe; never an evaluator module the task does not name, never torch
    assert infeasible and not torch
    unknown = probe.replace("metrics.check_include_exclude", "metrics.no_such_metric")
    done = subprocess.run(
        [python, "-I", "-c", unknown], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode != 0
    assert "AttributeError" in done.stderr and "no_such_metric" in done.stderr


async def test_missed_deadline_stops_the_worker(python, tmp_path):
    worker = await started_worker(python, tmp_path)
    pid = worker.pid
    # SIGSTOP: the worker is alive but never answers (as when stuck in DesktopEnv's sleeps)
    os.kill(pid, 19)
    t0 = time.perf_counter()
    with pytest.raises(DesktopError, match="no answer within 0.5 s") as err:
        await worker.call("evaluate", 0.5)
    assert err.value.kind == "evaluator"
    assert time.perf_counter() - t0 < 15
    assert not worker.alive()
    assert not os.path.exists(f"/proc/{pid}")  # stopped and reaped


async def test_dead_worker_is_a_transport_error(python, tmp_path):
    worker = await started_worker(python, tmp_path)
    os.kill(worker.pid, 9)
    with pytest.raises(DesktopError) as err:
        await worker.call("plan", 5, provider="docker", cache_dir=str(tmp_path))
    assert err.value.kind == "transport"


def test_worker_env_is_a_pass_list(monkeypatch):
    monkeypatch.setenv("LEGATO_POLICY_KEY", "sk-secret")
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/docker.sock")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = osworld_options.worker_env({"X": "1"}, provider="docker")
    assert "LEGATO_POLICY_KEY" not in env and "PYTHONPATH" not in env
    assert env["DOCKER_HOST"] == "unix:///run/docker.sock"
    assert env["PYTHON_DOTENV_DISABLED"] == "1" and env["X"] == "1"


def test_a_worker_gets_exactly_its_cloud_providers_credentials(monkeypatch):
    """An aws worker needs AWS's credentials (DesktopEnv starts and stops EC2 VMs with them),
    an azure worker Azure's; neither gets the other's, the hub token or Google's, and a
    worker of provider local (the local backend's grader) or one that starts no VM gets none."""
    creds = {
        "AWS_ACCESS_KEY_ID": "AKIA-test",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "AWS_SESSION_TOKEN": "aws-session",
        "AWS_REGION": "us-east-1",
        "AZURE_CLIENT_SECRET": "azure-secret",
        "AZURE_SUBSCRIPTION_ID": "azure-sub",
        "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/gcp.json",
        "HF_TOKEN": "hf-token",
        "LEGATO_POLICY_KEY": "sk-secret",
    }
    for name, value in creds.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.example")

    def secrets(env: dict) -> set[str]:
        return {name for name in creds if name in env}

    aws = osworld_options.worker_env(provider="aws")
    assert secrets(aws) == {n for n in creds if n.startswith("AWS_")}
    assert aws["AWS_SESSION_TOKEN"] == "aws-session"
    assert secrets(osworld_options.worker_env(provider="azure")) == {
        "AZURE_CLIENT_SECRET",
        "AZURE_SUBSCRIPTION_ID",
    }
    for provider in ("local", "docker", "vmware", None):
        env = osworld_options.worker_env({"LEGATO_VM_TOKEN": "t"}, provider=provider)
        assert secrets(env) == set(), provider
        assert env["HF_ENDPOINT"] == "https://hf-mirror.example"  # a mirror is no secret
        assert env["LEGATO_VM_TOKEN"] == "t"  # what the caller hands over on purpose


async def test_each_desktop_spares_included_holds_a_cache_folder_of_its_own(python, tmp_path):
    """A batch opens runners + spares desktops, desktop-0 .. desktop-<n-1>, each with its own
    DesktopEnv cache folder; another batch on this host with the same cache_dir is refused
    before any worker starts, rather than sharing desktop-<i> (where DesktopEnv and the
    getters write a task's files), and may go once the first one closed its desktops."""
    from legato_pipelines.desktops.osworld_worker.desktop import open_osworld_desktops

    root = tmp_path / "c"
    config = DesktopConfig(
        backend="osworld",
        options={"osworld_python": python, "cache_dir": str(root), "work_dir": str(tmp_path)},
    )
    runners, spares = 2, 2
    folders = [r["cache_dir"] for r in osworld_options.plan_desktops(config, runners + spares)]
    assert folders == [str(root / f"desktop-{i}") for i in range(4)]
    held = osworld_options.claim_cache_dir(folders[3])  # another batch's desktop 3 (a spare)
    try:
        with pytest.raises(ConfigError) as caught:
            await open_osworld_desktops(config, runners + spares)
        message = str(caught.value)
        assert f"{folders[3]} is in use by another batch on this host (pid {os.getpid()})" in (
            message
        )
        assert "fix: give each batch running at once its own --desktop-option cache_dir" in message
        # the folders it had claimed before it met desktop-3 are free again
        for folder in folders[:3]:
            osworld_options.claim_cache_dir(folder).close()
    finally:
        held.close()
    osworld_options.claim_cache_dir(folders[3]).close()  # free once its holder let go


def test_options_are_validated(tmp_path):
    def plan(**options):
        return osworld_options.plan_desktops(DesktopConfig(backend="osworld", options=options), 1)

    with pytest.raises(ConfigError, match="urls"):
        plan(urls=["http://x"])
    with pytest.raises(ConfigError, match="--osworld-provider"):
        plan(provider="nimbus")
    with pytest.raises(ConfigError, match="ready"):
        plan(provider="docker", ready="server")
    with pytest.raises(ConfigError, match="fast_mode"):
        plan(provider="docker", fast_mode="server")
    assert plan(provider="AWS")[0]["provider"] == "aws"
    assert plan(provider="docker")[0]["fast_mode"] == "vm"
    assert plan(provider="local")[0]["fast_mode"] == "server"
    local_vm = plan(provider="local", fast_mode="vm")[0]
    assert local_vm["baseline_dir"] == osworld_options.LOCAL_VM_BASELINE
    with pytest.raises(ConfigError, match="legato osworld install"):
        osworld_options.resolve_python(
            DesktopConfig(backend="osworld", options={"osworld_python": str(tmp_path / "nope")})
        )


def test_less_than_is_typed_as_osworld_fixes_it():
    code = render.render_osworld_code(Action(action="type", text="a<b\n<"))
    assert code.splitlines() == [
        "pyautogui.typewrite('a', interval=0.03)",
        render.LESS_THAN,
        "pyautogui.typewrite('b', interval=0.03)",
        "pyautogui.press('enter')",
        render.LESS_THAN,
    ]
    assert render.render_osworld_code(Action(action="type", text="ab")) == (
        "pyautogui.typewrite('ab', interval=0.03)"
    )


def test_fast_reset_script_kills_verifies_and_restores(tmp_path):
    """The in-VM fast reset, run here with bash on a fake HOME and a real process."""
    home, base = tmp_path / "home", tmp_path / "base"
    home.mkdir()
    base.mkdir()
    (base / "keep.txt").write_text("clean")
    (home / "junk.txt").write_text("task state")
    (home / ".hidden").mkdir()
    # a process name of our own (never pkill a name other processes on this machine share)
    name = f"lgt{os.getpid() % 100000}"
    binary = tmp_path / name
    shutil.copy("/bin/sleep", binary)
    sleeper = subprocess.Popen([str(binary), "60"])  # not reaped until we wait: a zombie
    env = {**os.environ, "HOME": str(home)}
    try:
        done = subprocess.run(
            ["bash", "-c", fast_reset_script([name], str(base))],
            capture_output=True,
            text=True,
            env=env,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert sleeper.wait(5) == -9
        assert sorted(p.name for p in home.iterdir()) == ["keep.txt"]
        missing = subprocess.run(
            ["bash", "-c", fast_reset_script([], str(tmp_path / "none"))],
            capture_output=True,
            text=True,
            env=env,
        )
        assert missing.returncode == 4
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "gnome-terminal-" in DOMAIN_PROCESSES["os"]
    assert set(DOMAIN_PROCESSES["chrome"]) <= set(DOMAIN_PROCESSES["multi_apps"])
    assert all(len(name) <= 15 for names in DOMAIN_PROCESSES.values() for name in names)


def test_worker_script_needs_no_project_dependency():
    """worker.py, its modules (worker_*.py: relative imports among themselves) and
    provider_local.py import only the standard library and desktop_env."""
    import ast

    # PIL: desktop_env's own dependency, only inside model_png (which sends the VM's own
    # screenshot without it)
    allowed = set(sys.stdlib_module_names) | {"desktop_env", "requests", "__future__", "PIL"}
    worker_side = sorted(channel.WORKER_SCRIPT.parent.glob("worker*.py"))
    assert len(worker_side) >= 5  # worker.py and its four modules
    for path in (*worker_side, channel.WORKER_SCRIPT.with_name("provider_local.py")):
        tree = ast.parse(path.read_text())
        names = {
            (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom)) and getattr(n, "level", 0) == 0
            for a in (n.names if isinstance(n, ast.Import) else [n])
        }
        assert names <= allowed, (path.name, names - allowed)


async def test_a_cancelled_call_retires_the_worker(python, tmp_path):
    """The engine's own deadline cancels a call: the late answer must never be taken as the
    next request's, so the worker is stopped and counts as not running."""
    worker = await started_worker(python, tmp_path)
    pid = worker.pid
    os.kill(pid, 19)  # never answers
    call = asyncio.create_task(worker.call("plan", 60, provider="docker", cache_dir="/x"))
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not worker.alive()
    with pytest.raises(DesktopError) as err:
        await worker.call("plan", 5, provider="docker", cache_dir="/x")
    assert err.value.kind == "transport"
    await worker.stop()
    assert not os.path.exists(f"/proc/{pid}")


def test_evaluator_names_are_checked_before_setup(python, tmp_path):
    """A metric desktop-env 1.0.2 lacks, or whose module needs a package the venv lacks, is an
    ``evaluator`` error naming the fix; easyocr (-> torch) is imported only when used."""
    worker_py = str(channel.WORKER_SCRIPT)
    probe = f"""
import json, runpy
w = runpy.run_path({worker_py!r})
w["install_lazy_evaluators"]()
import desktop_env.desktop_env
def check(func, result):
    task = {{"id": "t", "evaluator": {{"func": func, "result": {{"type": result}}}}}}
    try:
        w["check_evaluator"](task)
        return "ok"
    except w["WorkerError"] as exc:
        return exc.kind + ": " + str(exc)
out = [check("check_include_exclude", "vm_command_line"),
       check("check_play_and_exit", "vm_file"),
       check("compare_pptx_files", "vm_file"),
       check(["exact_match", "check_include_exclude"], "no_such_getter")]
import easyocr  # deferred: importing succeeds, using it imports the real package
try:
    easyocr.Reader
    out.append("Reader imported")
except ImportError as exc:
    out.append("ImportError: " + str(exc))
print(json.dumps(out))
"""
    env = {"PATH": "/usr/bin:/bin", "PYTHON_DOTENV_DISABLED": "1"}
    done = subprocess.run(
        [python, "-I", "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    ok, missing, heavy, getter, reader = json.loads(done.stdout.strip().splitlines()[-1])
    assert ok == "ok"
    assert missing.startswith("evaluator: desktop-env 1.0.2 has no metric 'check_play_and_exit'")
    if venv_imports(python, "pptx"):  # the full recipe (scripts/setup.sh): pptx metrics work
        assert heavy == "ok"
    else:  # the core recipe lacks python-pptx
        assert heavy.startswith("evaluator: metric 'compare_pptx_files' cannot be imported")
        assert "legato osworld install --full" in heavy
    assert "get_no_such_getter" in getter
    # core: easyocr itself is missing; full: easyocr is there (no deps), its torch is not
    assert reader.startswith("ImportError") and ("easyocr" in reader or "torch" in reader)


@pytest.mark.parametrize("interpreter", ["collector's", "osworld venv's"])
def test_worker_resize_is_the_collectors_byte_for_byte(python, interpreter, tmp_path):
    """The worker's model-size screenshot (``model_png``) is the collector-side resize of the
    same PNG, byte for byte, for both Qwen variants, under an interpreter with the collector's
    Pillow and imagecodecs (``images.png_codecs``); a screenshot already at the model's size,
    or a worker whose codecs are not the collector's versions (the OSWorld venv pins its own
    Pillow), sends the VM's own bytes (the collector then resizes)."""
    from legato_pipelines.desktops.backends.fake import frame_pool
    from legato_pipelines.harness import Harness
    from legato_pipelines.harness.resize import resize_screenshot
    from legato_pipelines.images import png_codecs

    interpreter = sys.executable if interpreter == "collector's" else python
    cases = []
    for screen in ((1280, 720), (1920, 1080)):
        frame = frame_pool(*screen, frames=2)[1]
        path = tmp_path / f"{screen[0]}.png"
        path.write_bytes(frame.png)
        for variant in ("qwen3vl", "qwen25vl"):
            rule = Harness(variant=variant).resize_rule
            cases.append((str(path), rule.size(*screen), resize_screenshot(frame, rule).png))
    cases.append((str(path), (1920, 1080), frame.png))
    cases.append((str(path), (1920, 1088), frame.png))  # other codecs: the VM's own bytes
    codecs = [png_codecs()] * (len(cases) - 1) + ["Pillow 0.0-not-this-one, imagecodecs 0"]
    probe = f"""
import runpy, sys
w = runpy.run_path({str(channel.WORKER_SCRIPT)!r})
print(w["_images"].png_codecs())
for i, (path, size) in enumerate({[(c[0], c[1]) for c in cases]!r}):
    out = w["model_png"](open(path, "rb").read(), size, {codecs!r}[i])
    open({str(tmp_path)!r} + f"/out-{{i}}.png", "wb").write(out)
"""
    done = subprocess.run(
        [interpreter, "-I", "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() != png_codecs():
        # the OSWorld venv's own Pillow (desktop-env pins it) or no imagecodecs: the worker
        # never resizes, every case is the VM's own bytes
        assert interpreter == python
        cases = [(png, size, Path(png).read_bytes()) for png, size, _ in cases]
    for i, (_, size, expected) in enumerate(cases):
        assert (tmp_path / f"out-{i}.png").read_bytes() == expected, size


def test_the_liveness_probe_asks_the_vm_server_for_no_screenshot():
    """Before each setup, action and evaluation the worker checks that the VM's server
    answers with its display up: ``GET /cursor_position`` with the VM's token. (It asked for
    ``/screenshot``, which made a local desktop grab and encode a full-size PNG, twice per
    attempt, only to drop it.)"""
    import http.server
    import runpy
    import threading

    seen = []

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(200)
            self.send_header("Content-Length", "6")
            self.end_headers()
            self.wfile.write(b"[3, 4]")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        worker = runpy.run_path(str(channel.WORKER_SCRIPT))["Worker"]()
        worker.base_url, worker.vm_token = f"http://127.0.0.1:{server.server_port}", "vm-token"
        worker._probe()
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("/cursor_position", "Bearer vm-token")]


@pytest.mark.slow
def test_installing_a_recipe_that_is_there_runs_no_pip(python, monkeypatch, tmp_path):
    """``legato osworld install`` on a venv whose ``legato-recipe.json`` holds the recipe's
    pip steps exactly runs no pip: a second pip run re-resolved the recipes, printed pip's
    resolver complaints and swapped Pillow back and forth (~40 s). The full recipe covers the
    core one; a core-only venv asked for the full recipe, or a recipe whose pins changed,
    runs its steps (pip is only recorded here: the real venv is not touched)."""
    import json

    from legato_pipelines.desktops.osworld_worker import install as install_mod

    venv = Path(python).parents[1]
    recipe = venv / install_mod.RECIPE_FILE
    kept = recipe.read_text() if recipe.exists() else None
    pips = []
    real_run = subprocess.run

    def run(argv, *args, **kwargs):
        if "pip" in argv:
            pips.append(argv)
            return subprocess.CompletedProcess(argv, 0)
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(install_mod.subprocess, "run", run)
    full, core = install_mod.recipe_steps(True), install_mod.recipe_steps(False)
    try:
        recipe.write_text(json.dumps({"steps": full}))
        assert install_mod.install(venv, full=False)["recipe"] == "full"
        assert install_mod.install(venv, full=True)["recipe"] == "full"
        assert pips == []
        recipe.write_text(json.dumps({"steps": core}))
        assert install_mod.install(venv, full=True)["recipe"] == "full"
        assert [argv[-len(s) :] for argv, s in zip(pips, full, strict=True)] == full
        assert json.loads(recipe.read_text())["steps"] == full
        pips.clear()
        monkeypatch.setattr(install_mod, "CORE", (*install_mod.CORE[:-1], "tqdm==4.66.0"))
        assert install_mod.install(venv, full=False)["recipe"] == "core"  # a pin changed
        assert len(pips) == 2
    finally:
        if kept is None:
            recipe.unlink(missing_ok=True)
        else:
            recipe.write_text(kept)
