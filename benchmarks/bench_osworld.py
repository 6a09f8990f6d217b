"""The osworld backend on the local-desktop provider: reset fast vs revert, and the per-action
ready signal polled through the VM server's API (``GET /screenshot``, frame diff on the
backend side) vs the local desktop server's own ready endpoint (``/legato/wait``).

    python benchmarks/bench_osworld.py --repeats 5

Real DesktopEnv (desktop-env 1.0.2 in its venv, ``legato osworld install``), SetupController
and OSWorld's evaluators against a real Xvfb desktop; needs ``scripts/osworld_venv.sh``.
Prints one JSON object: medians (and p90) in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from legato_pipelines.actions import Action
from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.client import DesktopClient
from legato_pipelines.desktops.osworld_worker.install import default_venv, venv_python
from legato_pipelines.tasks import load_tasks

NOOP_ACTION = "import pyautogui; import time; pyautogui.FAILSAFE = False; pass"
SUITE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "local"
#: xterm launch; l3afpad open_file; LibreOffice Calc open_file (a heavy app)
RESET_TASKS = ("local-term-mkdir", "local-edit-append", "local-calc-edit-cell")
#: fast_mode vm kills by OSWorld domain: only the Calc task has one (libreoffice_calc)
VM_RESET_TASKS = ("local-calc-edit-cell",)


def stats(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 4),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 4),
        "n": len(ordered),
    }


async def bench_resets(desktop, tasks, repeats: int, task_ids, kinds=(True, False)) -> dict:
    out: dict = {}
    for task_id in task_ids:
        task = tasks[task_id]
        for fast in kinds:
            desktop.config = desktop.config.model_copy(update={"fast_reset": fast})
            totals, parts, ready = [], {"clean_s": [], "revert_s": [], "setup_s": []}, []
            for _ in range(repeats):
                await desktop.act(Action(action="key", keys=("ctrl", "l")))  # the VM is "used"
                t0 = time.perf_counter()
                kind = await desktop.reset(task)
                wait = await desktop.wait_after_reset()
                totals.append(time.perf_counter() - t0)
                ready.append(wait.wait_s)
                assert kind == ("fast" if fast else "revert"), kind
                for key in parts:
                    parts[key].append(desktop.last_reset[key])
            out[f"{task_id}/{'fast' if fast else 'revert'}"] = {
                "reset_to_ready_s": stats(totals),
                "wait_after_reset_s": stats(ready),
                **{k: stats(v) for k, v in parts.items()},
            }
    return out


async def bench_action_wait(desktop, task, repeats: int) -> dict:
    await desktop.reset(task)
    await desktop.wait_after_reset()
    act, wait, ready = [], [], []
    for i in range(repeats):
        action = Action(action="type", text=f"echo {i}\n")
        t0 = time.perf_counter()
        await desktop.act(action)
        act.append(time.perf_counter() - t0)
        w = await desktop.wait_after_action(action)
        wait.append(w.wait_s)
        ready.append(w.ready_s)
    polls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await desktop.grab_frame()
        polls.append(time.perf_counter() - t0)
    # what every OSWorld action pays before typing: a fresh `python -c "import pyautogui..."`
    client = DesktopClient(desktop.vm_server.url, desktop.vm_server.token)
    noop = []
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            done = await client.execute(["python", "-c", NOOP_ACTION])
            noop.append(time.perf_counter() - t0)
            assert done["returncode"] == 0, done
    finally:
        await client.aclose()
    return {
        "noop_action_execute_s": stats(noop),
        "act_s": stats(act),
        "wait_s": stats(wait),
        "ready_s": stats(ready),
        "one_screenshot_poll_s": stats(polls),
    }


async def main_async(args) -> dict:
    tasks = {t.task_id: t for t in load_tasks(SUITE / "tasks.json")}
    python = args.osworld_python or str(venv_python(default_venv()))
    result: dict = {"repeats": args.repeats}
    for ready in ("screenshot", "server"):
        config = DesktopConfig(
            backend="osworld",
            options={"osworld_python": python, "provider": "local", "ready": ready},
        )
        t0 = time.perf_counter()
        [desktop] = await open_desktops(config, 1)
        try:
            if ready == "screenshot":
                result["open_s"] = round(time.perf_counter() - t0, 3)
                result["worker_import_s"] = round(desktop.last_start["import_s"], 3)
                result["resets"] = await bench_resets(desktop, tasks, args.repeats, RESET_TASKS)
            result[f"action_wait/{ready}"] = await bench_action_wait(
                desktop, tasks["local-term-mkdir"], args.repeats * 2
            )
        finally:
            await desktop.close()
    config = DesktopConfig(
        backend="osworld",
        options={"osworld_python": python, "provider": "local", "fast_mode": "vm"},
    )
    [desktop] = await open_desktops(config, 1)
    try:
        result["resets_fast_mode_vm"] = await bench_resets(
            desktop, tasks, args.repeats, VM_RESET_TASKS, kinds=(True,)
        )
    finally:
        await desktop.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--osworld-python", default=None)
    print(json.dumps(asyncio.run(main_async(ap.parse_args())), indent=2))


if __name__ == "__main__":
    main()
