"""OSWorld VM servers attached by URL (``desktops/server/vmserver.py``): a server that speaks only
OSWorld's base API is detected at attach and driven through it (fast reset over
/setup/execute, actions as ``python -c "import pyautogui; ..."`` over /execute, ready signal by
polling /screenshot, OSWorld-format setup and evaluation), with the local backend's rewards.

Real parts: a project local desktop server on Xvfb, seen through a test-only reverse proxy on
127.0.0.1 that forwards only OSWorld's base routes (the token injected by the proxy, as a VM
server has none) and answers 404 to everything else (``/legato/*``); the scripted policy
server; the engine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, load_tasks, read_records
from legato_pipelines.actions import Action
from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.server.vmserver import VMServerDesktop
from legato_pipelines.desktops.server.wire import DEFAULT_TOKEN_ENV
from legato_pipelines.errors import DesktopError
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from tests.desktop_local_support import RunningServer, needs_apps, needs_xvfb
from tests.osworld_backend_support import needs_vm_python
from tests.vmserver_support import BaseApiProxy

SUITE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "local"
TASKS = ["local-term-sort", "local-term-mkdir", "local-edit-append", "local-edit-replace"]
#: Live processes named $1 on this desktop's display (other desktops may share the user).
ON_DISPLAY = (
    'n=0; for p in $(pgrep -x "$0"); do tr "\\0" "\\n" < /proc/$p/environ 2>/dev/null'
    ' | grep -qx "DISPLAY=$DISPLAY" && n=$((n+1)); done; echo $n'
)

pytestmark = [needs_xvfb, needs_apps, needs_vm_python, pytest.mark.desktop, pytest.mark.slow]


@pytest.fixture
def vm_server(monkeypatch):
    """A local desktop server (1280x720) behind the base-API proxy; no token in this process."""
    monkeypatch.delenv(DEFAULT_TOKEN_ENV, raising=False)
    server = RunningServer(width=1280, height=720)
    try:
        with BaseApiProxy(server.url, server.token) as proxy:
            yield proxy
    finally:
        server.stop()


def subset(tmp_path: Path) -> Path:
    tasks = [t for t in orjson.loads((SUITE / "tasks.json").read_bytes()) if t["task_id"] in TASKS]
    path = tmp_path / "tasks.json"
    path.write_bytes(orjson.dumps(tasks))
    return path


@pytest.mark.parametrize("script,reward", [("correct", 1.0), ("wrong", 0.0)])
async def test_osworld_vm_server_by_url_scores_like_the_local_backend(
    tmp_path, vm_server, script, reward
):
    config = DesktopConfig(backend="local", options={"urls": [vm_server.url]})
    with ScriptedPolicyServer(flavor="vllm", script=SUITE / "scripts" / f"{script}.json") as policy:
        summary = await collect_async(
            subset(tmp_path),
            PolicyConfig(base_url=policy.url, model=policy.model),
            tmp_path / "run",
            desktops=1,
            desktop=config,
            group=1,
            max_steps=8,
        )
    records = read_records(tmp_path / "run")
    assert summary["missing"] == 0 and summary["counts"]["ok"] == len(TASKS)
    # the local backend's rewards for these scripts (tests/test_local_collect.py)
    assert {r["task_id"]: r["reward"] for r in records} == dict.fromkeys(TASKS, reward)
    assert all(r["reset"]["ready_s"] is not None for r in records)
    actions = [a for r in records for s in r["steps"] for a in s["actions"]]
    assert actions and all(a["ready_s"] is not None and 0 <= a["ready_s"] < 10 for a in actions)
    # base API only: one /legato/ probe at attach, never a token from the collector's side
    legato = [p for _, p, _ in vm_server.seen if p.startswith("/legato/")]
    assert legato == ["/legato/health"]
    assert not any(auth for *_, auth in vm_server.seen)
    paths = {p for _, p, _ in vm_server.seen}
    assert {"/screenshot", "/execute", "/setup/execute", "/file"} <= paths


async def test_fast_reset_kills_the_domain_apps_and_restores_home(tmp_path, vm_server):
    tasks = {t.task_id: t for t in load_tasks(subset(tmp_path))}
    (desktop,) = await open_desktops(
        DesktopConfig(backend="local", options={"urls": [vm_server.url]}), 1
    )
    try:
        assert isinstance(desktop, VMServerDesktop) and desktop.screen_size == (1280, 720)
        assert await desktop.reset(tasks["local-edit-append"]) == "fast"
        await desktop.wait_after_reset()
        client = desktop.client
        await client.execute("echo left-over > stray.txt", shell=True)
        editors = await client.execute(["sh", "-c", ON_DISPLAY, "l3afpad"])
        assert editors["output"].strip() == "1", "the task's setup opened the editor"
        for action in (
            Action(action="type", text="x<y "),  # '<' typed as shift+comma (OSWorld's fix)
            Action(action="key", keys=("ctrl", "s")),
        ):
            await desktop.act(action)
            await desktop.wait_after_action(action)
        assert (await client.file("notes.txt")).startswith(b"x<y Shopping list\n")
        assert await desktop.reset(tasks["local-term-mkdir"]) == "fast"
        assert await client.file("stray.txt") is None  # HOME is the attach-time baseline again
        assert await client.file("notes.txt") is None
        gone = await client.execute(["sh", "-c", ON_DISPLAY, "l3afpad"])
        assert gone["output"].strip() == "0"  # the previous (text_editor) task's app was killed
        terminals = await client.execute(["sh", "-c", ON_DISPLAY, "xterm"])
        assert terminals["output"].strip() == "1"  # the new task's setup started its terminal
        shot = await desktop.observe()
        assert (shot.width, shot.height) == (1280, 720)
    finally:
        await desktop.close()


async def test_task_needing_a_revert_is_refused_with_the_reason(tmp_path, vm_server):
    tasks = {t.task_id: t for t in load_tasks(subset(tmp_path))}
    config = DesktopConfig(backend="local", fast_reset=False, options={"urls": [vm_server.url]})
    (desktop,) = await open_desktops(config, 1)
    try:
        with pytest.raises(DesktopError, match="snapshot revert needs the osworld backend") as err:
            await desktop.reset(tasks["local-term-sort"])
        assert err.value.kind == "vm"
    finally:
        await desktop.close()


async def test_vanished_vm_server_fails_the_reset_and_is_lost_after_reconnect_window(
    tmp_path, vm_server
):
    tasks = {t.task_id: t for t in load_tasks(subset(tmp_path))}
    config = DesktopConfig(backend="local", options={"urls": [vm_server.url], "reconnect_s": 1})
    (desktop,) = await open_desktops(config, 1)
    try:
        await desktop.recover()  # answers: recovered at once
        vm_server.__exit__()
        with pytest.raises(DesktopError) as err:
            await desktop.reset(tasks["local-term-sort"])
        assert err.value.kind == "crash"
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(DesktopError, match="lost"):
            await desktop.recover()
        assert asyncio.get_running_loop().time() - t0 >= 1.0
    finally:
        await desktop.close()
