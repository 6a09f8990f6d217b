"""The local backend's two graders on the same tasks: OSWorld's own code (the osworld worker
attached to the desktop) vs the project's own subset, in the same run.

    python benchmarks/bench_local_grader.py [--n 5] [--json out.json]

Opens one sandboxed local desktop per grader (``grader=osworld`` / ``grader=own``, taking
turns, so machine load hits both alike) and measures, for tasks both graders can run:
  open     open_local_desktops (server start; plus the worker's start: importing desktop_env
           and constructing DesktopEnv, paid once per desktop)
  setup    LocalDesktop.reset (server reset + the task's setup), seconds
  eval     LocalDesktop.evaluate (postconfig, getters, metrics), seconds
Tasks: the local suite's terminal and editor tasks and OSWorld's e0df059f (sudo mkdir setup,
vm_command_line getter). Numbers are medians with (min-max). Leaves out the ready waits, the
policy and everything the engine does around an attempt; one desktop per grader.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.server import open_local_desktops
from legato_pipelines.tasks import load_tasks
from tests.osworld_data import LOCAL_SUITE, OSWORLD

TASKS = ("local-term-mkdir", "local-edit-append", "local-term-infeasible")
OSWORLD_TASK = ("os", "e0df059f-28a6-4169-924f-b9623e7184cc")


def _tasks():
    suite = {t.task_id: t for t in load_tasks(LOCAL_SUITE)}
    (os_task,) = load_tasks(
        [{"task_id": OSWORLD_TASK[1], "domain": OSWORLD_TASK[0]}], osworld=OSWORLD
    )
    return [suite[t] for t in TASKS] + [os_task]


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


async def bench(n: int) -> dict:
    tasks = _tasks()
    out: dict = {"n": n, "graders": {}}
    desktops = {}
    for grader in ("osworld", "own"):
        t0 = time.perf_counter()
        (desktops[grader],) = await open_local_desktops(
            DesktopConfig(backend="local", options={"grader": grader}), 1
        )
        out["graders"][grader] = {"open_s": time.perf_counter() - t0, "tasks": {}}
    try:
        for _ in range(n):
            for task in tasks:
                for grader, desktop in desktops.items():
                    row = out["graders"][grader]["tasks"].setdefault(
                        task.task_id, {"setup_s": [], "eval_s": [], "rewards": []}
                    )
                    t0 = time.perf_counter()
                    await desktop.reset(task)
                    t1 = time.perf_counter()
                    infeasible = task.evaluator.get("func") == "infeasible"
                    evaluation = await desktop.evaluate(task, last_action_fail=infeasible)
                    row["setup_s"].append(t1 - t0)
                    row["eval_s"].append(time.perf_counter() - t1)
                    row["rewards"].append(evaluation.reward)
    finally:
        for desktop in desktops.values():
            await desktop.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = asyncio.run(bench(args.n))
    for grader, data in result["graders"].items():
        print(f"{grader}: open {data['open_s']:.2f} s")
        for task_id, row in data["tasks"].items():
            print(
                f"  {task_id[:24]:24}  setup {_fmt(row['setup_s'])}  eval {_fmt(row['eval_s'])}"
                f"  rewards {sorted(set(row['rewards']))}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
