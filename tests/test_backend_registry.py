"""The backend registry (issue 35): a backend is its own module plus its registry entry.

A toy backend registered from inside a test runs a real engine batch (the scripted policy
server, the run directory, the preflight, the records) with nothing else edited; and every
registered backend that can run here passes the same conformance run of the desktop
protocol (open, reset, observe, act, evaluate, close).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from legato_pipelines.actions import Action
from legato_pipelines.desktops import open_desktops, warm_up
from legato_pipelines.desktops.backends.fake import frame_pool
from legato_pipelines.desktops.base import Desktop, DesktopConfig, Wait
from legato_pipelines.desktops.network import applies
from legato_pipelines.desktops.registry import (
    BUILTIN,
    DEFAULT_BACKEND,
    BackendSpec,
    Capabilities,
    get,
    names,
    register,
    unregister,
)
from legato_pipelines.desktops.support import backend_support
from legato_pipelines.errors import ConfigError
from legato_pipelines.osworld_format.classify import BackendSupport
from legato_pipelines.policy.config import PolicyConfig
from legato_pipelines.rollout.engine import collect, opens_late
from legato_pipelines.rollout.settings import spare_desktops
from legato_pipelines.store.rundir import read_records
from legato_pipelines.tasks import Evaluation, Task
from tests.engine_support import fake_tasks

REPO_ROOT = Path(__file__).resolve().parents[1]

# --- a toy backend, written here: its module would be this much -------------------------


class ToyOptions(BaseModel):
    """The toy backend's one option: the reward every attempt gets."""

    model_config = ConfigDict(extra="forbid")

    reward: float = 1.0


class ToyDesktop:
    """A desktop that shows one screen, counts what it is asked, and grades with its option."""

    def __init__(self, config: DesktopConfig, index: int):
        self.options = get("toy").check_options(config.options)
        self.name = f"toy-{index}"
        self.screen_size = config.screen_size
        self.calls: list[str] = []
        self._screen = frame_pool(*config.screen_size, frames=1)[0]

    async def reset(self, task: Task, *, seed: int = 0) -> str:
        self.calls.append("reset")
        return "fast"

    async def wait_after_reset(self) -> Wait:
        return Wait(0.0, 0.0, False)

    async def observe(self):
        self.calls.append("observe")
        return self._screen

    async def act(self, action: Action):
        self.calls.append(f"act:{action.action}")
        return None

    async def wait_after_action(self, action: Action) -> Wait:
        return Wait(0.0, 0.0, False)

    async def wait_before_eval(self) -> Wait:
        return Wait(0.0, 0.0, False)

    async def evaluate(self, task: Task, *, last_action_fail: bool = False) -> Evaluation:
        self.calls.append("evaluate")
        return Evaluation(reward=self.options.reward)

    async def recover(self) -> None:
        self.calls.append("recover")

    async def close(self) -> None:
        self.calls.append("close")


OPENED: list[ToyDesktop] = []


async def open_toys(config: DesktopConfig, n: int, first: int = 0) -> list[ToyDesktop]:
    desktops = [ToyDesktop(config, i) for i in range(first, first + n)]
    OPENED.extend(desktops)
    return desktops


@pytest.fixture
def toy():
    OPENED.clear()
    spec = register(
        BackendSpec(
            name="toy",
            summary="a test's own backend",
            open=open_toys,
            options=ToyOptions,
            capabilities=lambda options: Capabilities(
                opens_late=True, scratch=False, task_checks="fake"
            ),
            support=lambda options, desktops: BackendSupport(),
        )
    )
    yield spec
    unregister("toy")


def test_a_toy_backend_registered_here_runs_a_real_engine_batch(toy, policy_server, tmp_path):
    """Registered from the test, the toy backend is a valid ``DesktopConfig.backend``, its
    options are checked by its model, and the engine runs a batch on it (preflight, spares
    joining late, records graded by its ``evaluate``): no other file knows it."""
    assert "toy" in names()
    with pytest.raises(ConfigError, match="not toy-backend options"):
        asyncio.run(open_desktops(DesktopConfig(backend="toy", options={"colour": 1}), 1))
    config = DesktopConfig(backend="toy", options={"reward": 0.25})
    assert opens_late(config) and not applies(config)
    policy = PolicyConfig(base_url=policy_server.url, model=policy_server.model, version="v1")
    out = tmp_path / "run"
    summary = collect(fake_tasks(3), policy, out, desktop=config, desktops=2, group=2, max_steps=2)
    records = read_records(out)
    assert len(records) == 6, summary  # 3 tasks x group 2
    assert {r["reward"] for r in records} == {0.25}
    assert {d.name for d in OPENED} >= {"toy-0", "toy-1"}
    assert all(d.calls[-1] == "close" for d in OPENED)
    assert any(c.startswith("act:") for d in OPENED for c in d.calls)


def test_an_unknown_backend_is_refused_naming_the_registered_ones(toy):
    with pytest.raises(ValueError, match="unknown backend 'nope'.*fake.*local.*osworld.*toy"):
        DesktopConfig(backend="nope")
    with pytest.raises(ConfigError, match="unknown backend"):
        get("nope")
    with pytest.raises(ValueError, match="registered already"):
        register(dataclasses.replace(toy))


def test_one_default_backend():
    """The desktop config's, ``legato collect``'s and ``LEGATO_BACKEND``'s default is the
    registry's one (issue 35: there were three)."""
    import typer

    from legato_pipelines.cli import app
    from legato_pipelines.resources.defaults import default_resources

    assert DesktopConfig().backend == DEFAULT_BACKEND
    command = typer.main.get_command(app).commands["collect"]
    assert {p.name: p.default for p in command.params}["backend"] == DEFAULT_BACKEND
    assert default_resources()["desktops"].backend == DEFAULT_BACKEND


def test_capabilities_replace_the_names():
    """What the engine and the settings used to read off the names, now capabilities."""
    assert spare_desktops(None, desktops=2, backend="local") == 2
    assert spare_desktops(None, desktops=2, backend="osworld") == 0
    local_here, local_urls = (
        DesktopConfig(backend="local"),
        DesktopConfig(backend="local", options={"urls": ["http://127.0.0.1:1"]}),
    )
    assert opens_late(local_here) and not opens_late(local_urls)
    assert applies(local_here) and not applies(local_urls)
    assert applies(DesktopConfig(backend="osworld", options={"provider": "local"}))
    assert not applies(DesktopConfig(backend="osworld"))
    assert not opens_late(DesktopConfig(backend="osworld"))


def test_options_are_typed_by_the_backends_model():
    """A wrong type is a ``ConfigError`` naming the option and the backend, before anything
    starts; a value the model coerces is taken (``headless="false"`` is False, as the
    worker's start request then says)."""
    from legato_pipelines.desktops.osworld_worker.options import plan_desktops

    with pytest.raises(ConfigError, match="'frames' of the fake backend"):
        get("fake").check_options({"frames": "many"})
    with pytest.raises(ConfigError, match="'headless' of the osworld backend"):
        get("osworld").check_options({"headless": "maybe"})
    with pytest.raises(ConfigError, match="'urls' of the local backend"):
        get("local").check_options({"urls": "http://one-url-not-a-list"})
    config = DesktopConfig(backend="osworld", options={"headless": "false"})
    assert plan_desktops(config, 1)[0]["headless"] is False


# --- conformance: every registered backend that can run here ----------------------------

INFEASIBLE = Task(
    task_id="conformance",
    domain=None,
    source="inline",
    config={
        "instruction": "Nothing to do: say it cannot be done.",
        "config": [],
        "evaluator": {"func": "infeasible"},
        "fake": {"success": 1.0},
    },
)


def _runs_here(name: str, tmp_path) -> DesktopConfig | None:
    """A config of backend ``name`` that runs on this host without VMs, or ``None``."""
    if name == "fake":
        return DesktopConfig(backend="fake")
    desktop_apps = all(shutil.which(a) for a in ("Xvfb", "openbox", "xterm"))
    if name == "local" and desktop_apps:
        return DesktopConfig(backend="local", options={"grader": "own"})
    if name == "osworld" and desktop_apps:
        from legato_pipelines.desktops.osworld_worker.install import default_venv, is_installed

        if is_installed(default_venv()):  # provider local: a desktop server is the "VM"
            options = {"cache_dir": str(tmp_path / "cache"), "work_dir": str(tmp_path / "work")}
            return DesktopConfig(backend="osworld", options={"provider": "local", **options})
    return None


@pytest.mark.desktop
@pytest.mark.parametrize("name", list(BUILTIN))
async def test_every_backend_conforms_to_the_desktop_protocol(name, tmp_path):
    """open, reset, observe, act, evaluate, close on one desktop of each built-in
    backend that can run here (osworld only with provider local: no VM), and the parts of
    its registry entry: an unknown option refused, capabilities, the support check."""
    spec = get(name)
    with pytest.raises(ConfigError, match=f"not {name}-backend options"):
        spec.check_options({"no_such_option": 1})
    assert isinstance(spec.capabilities({}), Capabilities)
    assert isinstance(backend_support(name, {}), BackendSupport)
    config = _runs_here(name, tmp_path)
    if config is None:
        pytest.skip(f"backend {name} cannot run on this host")
    async with warm_up(config):
        [desktop] = await asyncio.wait_for(open_desktops(config, 1), 300)
        try:
            assert isinstance(desktop, Desktop)
            assert await desktop.reset(INFEASIBLE) in ("fast", "revert")
            assert isinstance(await desktop.wait_after_reset(), Wait)
            shot = await desktop.observe()
            assert (shot.width, shot.height) == desktop.screen_size
            click = Action("left_click", x=5, y=5)
            await desktop.act(click)
            assert isinstance(await desktop.wait_after_action(click), Wait)
            assert isinstance(await desktop.wait_before_eval(), Wait)
            evaluation = await desktop.evaluate(INFEASIBLE, last_action_fail=True)
            assert evaluation.reward == 1.0
        finally:
            await desktop.close()


def test_tasks_check_takes_a_registered_backend(toy, tmp_path):
    """``legato tasks check --backend toy`` checks the tasks by the verdict kind the toy
    backend registered (``fake``: its tasks' ``fake`` block), with no CLI edit."""
    import orjson
    from typer.testing import CliRunner

    from legato_pipelines.cli import app

    tasks = tmp_path / "tasks.json"
    tasks.write_bytes(orjson.dumps(fake_tasks(2)))
    done = CliRunner().invoke(app, ["tasks", "check", str(tasks), "--backend", "TOY", "--json"])
    assert done.exit_code == 0, done.output
    assert orjson.loads(done.output)["backends_checked"] == ["fake"]
    bad = CliRunner().invoke(app, ["tasks", "check", str(tasks), "--backend", "nope"])
    assert bad.exit_code != 0 and "toy" in bad.output


# --- a backend written outside the repo, used from the command line -----------------------

#: A scratch module holding a backend: what a user writes outside the repo (no other file).
TOY_MODULE = """
from pydantic import BaseModel, ConfigDict

from legato_pipelines.desktops.registry import BackendSpec, Capabilities, register
from legato_pipelines.osworld_format.classify import BackendSupport


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reward: float = 1.0


async def _open(config, n, first=0):
    raise RuntimeError("not opened by tasks check")


SPEC = register(
    BackendSpec(
        name="{name}",
        summary="a scratch module's backend",
        open=_open,
        options=Options,
        capabilities=lambda options: Capabilities(scratch=False, task_checks="fake"),
        support=lambda options, desktops: BackendSupport(),
    )
)
"""


def _legato(*args: str, env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    """``legato ARGS`` as a user runs it: a subprocess with ``env`` over a clean environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LEGATO_")}
    return subprocess.run(
        [sys.executable, "-m", "legato_pipelines", *args],
        cwd=cwd, env=clean | env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _tasks_file(tmp_path):
    import orjson

    tasks = tmp_path / "tasks.json"
    tasks.write_bytes(orjson.dumps(fake_tasks(2)))
    return tasks


@pytest.mark.slow
def test_a_scratch_modules_backend_is_used_from_the_command_line(tmp_path):
    """``LEGATO_BACKEND_MODULES=toy_backend`` with the module on ``PYTHONPATH``: ``legato
    tasks check --backend toy`` finds the backend (no file of the repo edited) and classifies
    the tasks by its verdict kind; without the variable, the name is refused."""
    import orjson

    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "toy_backend.py").write_text(TOY_MODULE.replace("{name}", "toy"))
    path = f"{tmp_path / 'plugins'}{os.pathsep}{REPO_ROOT}"
    tasks = _tasks_file(tmp_path)
    env = {"PYTHONPATH": path, "LEGATO_BACKEND_MODULES": "toy_backend"}
    done = _legato(
        "tasks", "check", str(tasks), "--backend", "toy", "--json", env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = orjson.loads(done.stdout)
    assert doc["backends_checked"] == ["fake"] and doc["ok"]
    assert [t["backends"] for t in doc["tasks"]] == [["fake"], ["fake"]]
    without = _legato("tasks", "check", str(tasks), "--backend", "toy",
                      env={"PYTHONPATH": path}, cwd=tmp_path)  # fmt: skip
    assert without.returncode == 2 and "--backend 'toy'" in without.stdout + without.stderr
    missing = _legato("tasks", "check", str(tasks), "--backend", "toy",
                      env=env | {"LEGATO_BACKEND_MODULES": "no_such_mod"}, cwd=tmp_path)  # fmt: skip
    said = missing.stdout + missing.stderr
    assert missing.returncode == 2 and "LEGATO_BACKEND_MODULES: module 'no_such_mod'" in said
    assert "Traceback" not in said


@pytest.mark.slow
def test_an_installed_packages_entry_point_backend_is_used_from_the_command_line(tmp_path):
    """A package installed with an entry point of group ``legato_pipelines.backends`` (here a
    dist-info directory on ``sys.path``, as pip leaves it): ``--backend toyep`` loads it
    lazily and checks the tasks; ``names()`` lists it before it is loaded."""
    import orjson

    site = tmp_path / "site"
    (site / "toyep_pkg").mkdir(parents=True)
    (site / "toyep_pkg" / "__init__.py").write_text("")
    (site / "toyep_pkg" / "backend.py").write_text(TOY_MODULE.replace("{name}", "toyep"))
    info = site / "toyep_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyep-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[legato_pipelines.backends]\ntoyep = toyep_pkg.backend\n"
    )
    env = {"PYTHONPATH": f"{site}{os.pathsep}{REPO_ROOT}"}
    tasks = _tasks_file(tmp_path)
    done = _legato(
        "tasks", "check", str(tasks), "--backend", "toyep", "--json", env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = orjson.loads(done.stdout)
    assert doc["backends_checked"] == ["fake"] and doc["ok"]
    listed = subprocess.run(
        [sys.executable, "-c", "from legato_pipelines.desktops import registry as r; "
         "print(r.names()); print('toyep' in r._REGISTRY); print(r.get('toyep').summary)"],
        cwd=tmp_path, env=dict(os.environ) | env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    first, registered_early, summary = listed.stdout.splitlines()
    assert "'toyep'" in first and registered_early == "False"
    assert summary == "a scratch module's backend"


# --- options are checked by the registry, before a backend's code runs -----------------------


@pytest.fixture
def lax():
    """A backend whose opener and support check nothing: they record that they ran."""
    ran: list[str] = []

    async def open_lax(config, n, first=0):
        ran.append("open")
        return await open_toys(config, n, first)

    def support(options, desktops):
        ran.append("support")
        return BackendSupport()

    register(
        BackendSpec(
            name="lax",
            summary="checks no option itself",
            open=open_lax,
            options=ToyOptions,
            capabilities=lambda options: Capabilities(scratch=False, task_checks="fake"),
            support=support,
        )
    )
    yield ran
    unregister("lax")


def test_the_registry_checks_options_before_the_backends_code_runs(lax, policy_server, tmp_path):
    """A backend that never calls ``check_options`` still gets its options checked: opening,
    the support check and collect refuse a bad one with a ``ConfigError`` naming the option,
    the backend and the fix (no raw ValidationError), before the backend's code runs and
    before a run directory is written."""
    bad = DesktopConfig(backend="lax", options={"reward": "abc"})
    message = "desktop option 'reward' of the lax backend: .*got 'abc' \\(fix: --desktop-option"
    with pytest.raises(ConfigError, match=message):
        asyncio.run(open_desktops(bad, 1))
    with pytest.raises(ConfigError, match="not lax-backend options.*fix: --desktop-option"):
        backend_support("lax", {"colour": 1})
    with pytest.raises(ConfigError, match=message):
        with warm_up(bad):
            pass
    assert lax == []
    policy = PolicyConfig(base_url=policy_server.url, model=policy_server.model, version="v1")
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=message):
        collect(fake_tasks(1), policy, out, desktop=bad, max_steps=1)
    assert lax == [] and not out.exists()


@pytest.mark.slow
def test_collect_refuses_a_bad_fake_option_before_run_json(policy_server, tmp_path):
    """``legato collect --desktop-option latency=abc`` (the fake backend's option is a mapping)
    exits 2 naming the option, the backend and the fix, with nothing written (it used to leave
    run.json and an empty rollouts.jsonl)."""
    out = tmp_path / "run"
    tasks = _tasks_file(tmp_path)
    done = _legato("collect", "--tasks", str(tasks), "--desktop-option", "latency=abc",
                   "--policy-url", policy_server.url, "--model", policy_server.model,
                   "--version", "v1", "--out", str(out), "--no-progress", env={"PYTHONPATH": str(REPO_ROOT)}, cwd=tmp_path)  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert (
        "desktop option 'latency' of the fake backend" in said and "fix: --desktop-option" in said
    )
    assert "Traceback" not in said
    assert not out.exists()
