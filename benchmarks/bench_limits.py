"""Benchmark: other desktops' step time while one desktop runs a fork bomb, a memory hog or a
disk fill, against the same desktops with that one idle (issue 30 item 5: within 1.5x).

    python benchmarks/bench_limits.py [--width 1280 --height 720] [--n 20] [--victims 2]
                                      [--limits '{"cpus": 1}']
                                      [--attacker-limits '{"memory": "1g", "disk": "2g"}']
                                      [--json out.json]
    python benchmarks/bench_limits.py --footprint      (a busy desktop's use, for the defaults)

Starts 1 + ``--victims`` sandboxed local desktops (each with its own resource caps,
limits.py; the victims with the defaults). Every victim is reset to a terminal task (xterm),
then a *step* is what the engine does per action: ``act`` (type 2 characters into the
terminal) + ``wait_after_action`` (the ready wait) + ``observe`` at the model's size; the
victims take turns, ``--n`` steps each per condition. Conditions, on the attacker, started
through ``/execute`` as a policy's typed command would run, and given 2 s to get going:

  idle      nothing
  forkbomb  the classic ``b(){ b|b& };b`` (bounded by the attacker's pids cap)
  memhog    ``head -c 64G /dev/zero | tail`` in a loop (OOM-killed at the memory cap, again)
  diskfill  ``dd`` of zeros into HOME until ENOSPC, removed, again (IO at the disk cap)

Each attack first runs until the attacker reports its cap hit (``/legato/health``
``limits.hit``, up to 30 s), then the victims' steps are measured while it goes on. After each
condition the attacker is reset (a hit cap reverts its sandbox). Reported: the median and p90
step time per condition, the ratio of each median to idle's, and the cap the attacker hit. Needs root, Xvfb, openbox, xterm.
"""

from __future__ import annotations

import asyncio
import json
import time

from bench_local_desktop import TERMINAL, screen_parser, summary
from rich.console import Console
from rich.table import Table

from legato_pipelines.actions import Action
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.server import open_local_desktops

ATTACKS = {
    "idle": None,
    "forkbomb": "b(){ b|b& };b",
    "memhog": "while :; do head -c 64G /dev/zero | tail; done",
    "diskfill": "while :; do dd if=/dev/zero of=$HOME/fill bs=1M 2>/dev/null; rm -f $HOME/fill; done",
}


async def open_one(width: int, height: int, limits) -> object:
    config = DesktopConfig(
        backend="local",
        screen_width=width,
        screen_height=height,
        options={"limits": limits, "prebuild": [], "grader": "own"},
    )
    (desktop,) = await open_local_desktops(config, 1)
    return desktop


async def step(desktop, size: tuple[int, int]) -> float:
    action = Action("type", text="ab")
    t0 = time.perf_counter()
    await desktop.act(action)
    await desktop.wait_after_action(action)
    await desktop.observe(size)
    return time.perf_counter() - t0


async def bench(width: int, height: int, n: int, victims: int, limits, attacker_limits) -> dict:
    attacker = await open_one(width, height, {**limits, **attacker_limits})
    others = [await open_one(width, height, limits or True) for _ in range(victims)]
    size = (width // 2, height // 2)
    results: dict = {"screen": [width, height], "n": n, "victims": victims, "conditions": {}}
    try:
        for name, command in ATTACKS.items():
            await attacker.reset(TERMINAL)
            for victim in others:
                await victim.reset(TERMINAL)
                await victim.wait_after_reset()
            hit = None
            if command is not None:
                background = f"setsid sh -c {json.dumps(command)} >/dev/null 2>&1 &"
                await attacker.client.execute(background, shell=True, timeout=10)
                deadline = time.monotonic() + 30  # until the cap is hit (the attack goes on)
                while hit is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    hit = ((await attacker.client.health()).get("limits") or {}).get("hit")
            times = []
            for _ in range(n):
                for victim in others:
                    times.append(await step(victim, size))
            results["conditions"][name] = {"step_s": summary(times), "attacker_hit": hit}
        reset = await attacker.client.reset(full=False)
        results["last_attacker_reset"] = reset.get("kind")
    finally:
        await asyncio.gather(attacker.close(), *(v.close() for v in others))
    idle = results["conditions"]["idle"]["step_s"]["median"]
    for cond in results["conditions"].values():
        cond["ratio_to_idle"] = cond["step_s"]["median"] / idle
    return results


#: Apps a busy desktop holds open at once for ``--footprint`` (OSWorld's heavy ones).
BUSY_APPS = (
    ["libreoffice", "--calc"],
    ["libreoffice", "--writer"],
    ["google-chrome", "https://example.com", "about:blank", "chrome://version"],
    ["gimp"],
    ["thunderbird"],
)


def cgroup_pss(pids: list[int]) -> int:
    """Sum of ``Pss:`` of ``/proc/PID/smaps_rollup`` (bytes) over ``pids``."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except OSError:
            pass
    return total


async def footprint(width: int, height: int, seconds: float = 60.0) -> dict:
    """One desktop with :data:`BUSY_APPS` open: the peak PSS of its cgroup's processes, its
    peak task count (``pids.current``: threads too), the memory cgroup's peak (page cache
    included; v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``) and its disk's use."""
    desktop = await open_one(width, height, True)
    try:
        limits = (await desktop.client.health())["limits"]
        by_name = {
            p.split("/")[4] if limits["cgroup"] == "v1" else "all": p for p in limits["paths"]
        }
        pids_dir = by_name.get("pids", by_name.get("all"))
        mem_dir = by_name.get("memory", by_name.get("all"))
        for argv in BUSY_APPS:
            await desktop.client.launch(argv)
        peak = {"pss": 0, "tasks": 0}
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(2)
            with open(f"{pids_dir}/cgroup.procs") as f:
                members = [int(p) for p in f.read().split()]
            with open(f"{pids_dir}/pids.current") as f:
                peak["tasks"] = max(peak["tasks"], int(f.read()))
            peak["pss"] = max(peak["pss"], cgroup_pss(members))
        name = "memory.max_usage_in_bytes" if limits["cgroup"] == "v1" else "memory.peak"
        with open(f"{mem_dir}/{name}") as f:
            peak["memory_cgroup"] = int(f.read())
        health = await desktop.client.health()
        peak["disk_used"] = health["limits"]["disk_used"]
        peak["windows"] = [w["class"] for w in await desktop.client.windows()]
        peak["hit"] = health["limits"]["hit"]
        return peak
    finally:
        await desktop.close()


def show(results: dict) -> None:
    table = Table(
        title=f"victims' step time (act + ready wait + observe), {results['victims']} victims"
    )
    for col in ("attacker", "median s", "p90 s", "x idle", "cap hit"):
        table.add_column(col)
    for name, cond in results["conditions"].items():
        s = cond["step_s"]
        table.add_row(
            name,
            f"{s['median']:.3f}",
            f"{s['p90']:.3f}",
            f"{cond['ratio_to_idle']:.2f}",
            str(cond["attacker_hit"]),
        )
    Console().print(table)


def main() -> None:
    parser = screen_parser(__doc__)
    parser.add_argument("--victims", type=int, default=2)
    parser.add_argument(
        "--footprint",
        action="store_true",
        help="instead: one desktop with LibreOffice Calc and Writer, Chromium, GIMP and"
        " Thunderbird open for 60 s; its peak PSS, tasks, memory cgroup and disk use",
    )
    parser.add_argument(
        "--limits", default="{}", help="every desktop's desktop option limits (JSON object)"
    )
    parser.add_argument(
        "--attacker-limits",
        default='{"memory": "1g", "disk": "2g"}',
        help="the attacking desktop's desktop option limits (JSON; default: smaller memory and"
        " disk caps than the defaults, so the hog and the fill reach them in seconds)",
    )
    args = parser.parse_args()
    if args.footprint:
        found = asyncio.run(footprint(args.width, args.height))
        print(json.dumps(found, indent=2))
        return
    results = asyncio.run(
        bench(
            args.width,
            args.height,
            args.n,
            args.victims,
            json.loads(args.limits),
            json.loads(args.attacker_limits),
        )
    )
    show(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
