"""Benchmark the local desktop: ready-signal cost, action/observe latency, reset-to-ready.

    python benchmarks/bench_local_desktop.py [--width 1280 --height 720] [--n 10] [--json out.json]

Starts one real desktop server (Xvfb + openbox) and measures, with real apps:
  probe      one ready-signal probe in-process: raw grab + frame comparison (ms)
  act        POST /legato/act round trip for a click, a 20-character type, a key chord (ms)
  ready      POST /legato/wait after typing into l3afpad: ready_s and the whole wait (s)
  observe    GET /legato/observe: PNG grab + encode + transfer (ms) and PNG size (KB); the
             whole screen and the model's size (qwen3vl), with the server's CPU per observation
  reset      reset-to-ready for an editor task (l3afpad on a file) and a terminal task (xterm):
             LocalDesktop.reset (server fast reset + setup steps) + wait_after_reset (s)
  calc       (--calc) the same for a LibreOffice Calc task (open a CSV), with a fresh profile
             per attempt vs a profile pre-built into the baseline HOME
Numbers are medians with (min-max). Needs Xvfb, openbox, l3afpad and xterm.

    python benchmarks/bench_local_desktop.py --signals [--n 30] [--calc] [--json out.json]

instead compares the two sources of the ready signal side by side on the same desktop and the
same tasks, alternating per action (``/legato/wait`` with ``source=poll``, the frame polling,
then ``source=damage``, the X server's drawing reports): ready_s median and p90 per action,
and the share of early returns. An early return: the frame grabbed right after the wait
answered (in this process, on the same display, without the cursor) differs from the frame
grabbed 0.5 s later by more than the ready signal's caret rule (at most 64 pixels inside a box
at most 4 px wide and 40 px tall). Actions: typing 20 characters into l3afpad, typing
``echo N`` + Enter into xterm (the shell prints a line), reset -> ready of the editor and the
terminal task, with ``--calc`` typing a number + Enter into a LibreOffice Calc cell, with
``--chrome`` typing 20 characters into a textarea in Chromium (as ``google-chrome``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from rich.console import Console
from rich.table import Table

from legato_pipelines.actions import Action
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.server import open_local_desktops
from legato_pipelines.harness import Harness
from legato_pipelines.tasks import Task


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(values: list[float], scale: float = 1.0) -> dict:
    values = [v * scale for v in values]
    return {
        "median": statistics.median(values),
        "p90": statistics.quantiles(values, n=10, method="inclusive")[-1]
        if len(values) > 1
        else values[0],
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def task(task_id: str, steps: list[dict]) -> Task:
    return Task(
        task_id,
        None,
        {"instruction": task_id, "config": steps, "evaluator": {"func": "infeasible"}},
        "inline",
    )


EDITOR = task(
    "editor",
    [
        {
            "type": "execute",
            "parameters": {"command": "printf 'draft\\n' > ~/todo.txt", "shell": True},
        },
        {"type": "launch", "parameters": {"command": ["l3afpad", "~/todo.txt"]}},
    ],
)
TERMINAL = task("terminal", [{"type": "launch", "parameters": {"command": ["xterm"]}}])
CALC = task(
    "calc",
    [
        {
            "type": "execute",
            "parameters": {
                "command": "printf 'item,qty\\napples,3\\n' > ~/data.csv",
                "shell": True,
            },
        },
        {"type": "open", "parameters": {"path": "~/data.csv"}},
    ],
)


async def bench_calc(width: int, height: int, n: int) -> dict:
    """Reset-to-ready of a LibreOffice Calc task, with and without a pre-built profile
    (alternating desktops, so machine load hits both alike)."""
    results = {}
    desktops = {}
    for name, prebuild in (("fresh_profile", ()), ("prebuilt_profile", ("libreoffice",))):
        config = DesktopConfig(
            backend="local",
            screen_width=width,
            screen_height=height,
            options={"prebuild": list(prebuild)},
        )
        (desktops[name],) = await open_local_desktops(config, 1)
        results[name] = {"reset_to_ready_s": [], "ready_s": []}
    try:
        for _ in range(n):
            for name, desktop in desktops.items():
                t0 = time.perf_counter()
                await desktop.reset(CALC)
                waited = await desktop.wait_after_reset()
                results[name]["reset_to_ready_s"].append(time.perf_counter() - t0)
                results[name]["ready_s"].append(waited.ready_s)
    finally:
        for desktop in desktops.values():
            await desktop.reset(TERMINAL)
            await desktop.close()
    return {name: {k: summary(v) for k, v in r.items()} for name, r in results.items()}


def probe_cost(display: str, n: int = 200) -> dict:
    from legato_pipelines.desktops.ready import frame_delta
    from legato_pipelines.desktops.server.screen import Screen

    screen = Screen(display)
    previous = screen.frame()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        current = screen.frame()
        frame_delta(previous, current)
        times.append(time.perf_counter() - t0)
        previous = current
    screen.close()
    return summary(times, 1000)


async def bench(width: int, height: int, n: int) -> dict:
    (desktop,) = await open_local_desktops(
        DesktopConfig(backend="local", screen_width=width, screen_height=height), 1
    )
    client = desktop.client
    results: dict = {"screen": [width, height]}
    try:
        health = await client.health()
        results["probe_ms"] = await asyncio.to_thread(probe_cost, health["display"])

        await desktop.reset(EDITOR)
        await desktop.wait_after_reset()
        acts: dict[str, list[float]] = {"click": [], "type20": [], "key": []}
        ready, waits = [], []
        for i in range(n):
            for name, action in (
                ("click", Action("left_click", x=width // 2, y=height // 2)),
                ("type20", Action("type", text=f"line {i:02d} of the bench\n"[:20])),
                ("key", Action("key", keys=("ctrl", "s"))),
            ):
                t0 = time.perf_counter()
                await desktop.act(action)
                acts[name].append(time.perf_counter() - t0)
                waited = await desktop.wait_after_action(action)
                if name == "type20":
                    ready.append(waited.ready_s)
                    waits.append(waited.wait_s)
        results["act_ms"] = {name: summary(v, 1000) for name, v in acts.items()}
        results["ready_after_type"] = {"ready_s": summary(ready), "wait_s": summary(waits)}

        obs, sizes = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            shot = await desktop.observe()
            obs.append(time.perf_counter() - t0)
            sizes.append(len(shot.png) / 1024)
        results["observe_ms"] = summary(obs, 1000)
        results["png_kb"] = summary(sizes)
        # the whole screen (as the collector used to get it) and the model's size (issue 18):
        # wall per observation and the desktop server process's own CPU per observation
        model = Harness().episode("x", (width, height)).model_size
        for key, size in (("observe_full", None), ("observe_model", model)):
            times, cpu0 = [], process_cpu_s(desktop.server.pid)
            for _ in range(4 * n):
                t0 = time.perf_counter()
                shot = await desktop.observe(size)
                times.append(time.perf_counter() - t0)
            results[key] = {
                "size": list(shot.size), "wall_ms": summary(times, 1000),
                "server_cpu_ms": (process_cpu_s(desktop.server.pid) - cpu0) / (4 * n) * 1000,
                "png_kb": len(shot.png) / 1024,
            }  # fmt: skip

        for t in (EDITOR, TERMINAL):
            totals, server_reset, ready_s = [], [], []
            for _ in range(n):
                t0 = time.perf_counter()
                await desktop.reset(t)
                waited = await desktop.wait_after_reset()
                totals.append(time.perf_counter() - t0)
                server_reset.append(desktop.last_reset["reset_s"])
                ready_s.append(waited.ready_s)
            results[f"reset_{t.task_id}"] = {
                "reset_to_ready_s": summary(totals),
                "server_reset_s": summary(server_reset),
                "ready_s": summary(ready_s),
            }
    finally:
        await desktop.close()
    return results


CALC_BLANK = task("calc-blank", [{"type": "launch", "parameters": {"command": ["localc"]}}])
TEXTAREA = "data:text/html,<textarea autofocus rows=20 cols=80></textarea>"
CHROME_PAGE = task(
    "chrome-textarea",
    [{"type": "launch", "parameters": {"command": ["google-chrome", TEXTAREA]}}],
)
SIGNALS = ("poll", "damage")
LATER_S = 0.5  # an early return: the returned frame differs from the frame this much later


def settled_later(display: str):
    """A checker ``check() -> (early, changed_px)``: grabs the frame now and ``LATER_S``
    later (raw, without the cursor) and compares them with the ready signal's caret rule."""
    from legato_pipelines.desktops.ready import ReadyPolicy, frame_delta, is_quiet
    from legato_pipelines.desktops.server.screen import Screen

    screen = Screen(display)

    def check() -> tuple[bool, int]:
        returned = screen.frame()
        time.sleep(LATER_S)
        delta = frame_delta(returned, screen.frame())
        return not is_quiet(delta, ReadyPolicy()), delta.changed

    return check, screen.close


async def bench_signals(width: int, height: int, n: int, calc: bool, chrome: bool) -> dict:
    """Poll vs damage ready signal, alternating on the same desktop and tasks (module doc)."""
    (desktop,) = await open_local_desktops(
        DesktopConfig(backend="local", screen_width=width, screen_height=height), 1
    )
    client = desktop.client
    runs: dict[str, dict[str, dict[str, list]]] = {}
    check, close_screen = settled_later((await client.health())["display"])

    def record(action, signal, ready_s, early: tuple[bool, int], total_s=None) -> None:
        row = runs.setdefault(action, {}).setdefault(
            signal, {"ready_s": [], "early": [], "reset_to_ready_s": []}
        )
        row["ready_s"].append(ready_s)
        row["early"].append(early[1] if early[0] else 0)
        if total_s is not None:
            row["reset_to_ready_s"].append(total_s)

    async def typed(action: str, make_action) -> None:
        for i in range(n):
            for signal in SIGNALS:
                await desktop.act(make_action(i))
                waited = await client.wait("action", source=signal, timeout_s=5.0)
                assert waited["source"] == signal, waited
                record(action, signal, waited["ready_s"], await asyncio.to_thread(check))

    try:
        for t in (EDITOR, TERMINAL):
            for _ in range(n):
                for signal in SIGNALS:
                    t0 = time.perf_counter()
                    await desktop.reset(t)
                    waited = await client.wait("reset", source=signal, timeout_s=10.0)
                    total = time.perf_counter() - t0
                    early = await asyncio.to_thread(check)
                    record(f"reset->ready {t.task_id}", signal, waited["ready_s"], early, total)
        await desktop.reset(EDITOR)
        await client.wait("reset")
        await typed(
            "type 20 chars, l3afpad", lambda i: Action("type", text=f"l{i:02d} bench text.\n")
        )
        await desktop.reset(TERMINAL)
        await client.wait("reset")
        await typed("type echo + Enter, xterm", lambda i: Action("type", text=f"echo {i}\n"))
        if calc:
            await desktop.reset(CALC_BLANK)
            await client.wait("reset", timeout_s=30.0)
            await asyncio.sleep(2.0)  # let a cold LibreOffice finish its first paints
            await typed("type number + Enter, Calc", lambda i: Action("type", text=f"{i}\n"))
        if chrome:
            await desktop.reset(CHROME_PAGE)
            await client.wait("reset", timeout_s=30.0)
            await asyncio.sleep(2.0)  # let a cold Chromium finish its first paints
            await typed(
                "type 20 chars, Chromium textarea",
                lambda i: Action("type", text=f"c{i:02d} bench text.\n"),
            )
    finally:
        close_screen()
        await desktop.reset(TERMINAL)
        await desktop.close()
    return {
        "screen": [width, height],
        "later_s": LATER_S,
        "actions": {
            action: {
                signal: {
                    "ready_s": summary(r["ready_s"]),
                    **(
                        {"reset_to_ready_s": summary(r["reset_to_ready_s"])}
                        if r["reset_to_ready_s"]
                        else {}
                    ),
                    "early": sum(1 for e in r["early"] if e),
                    "early_changed_px": [e for e in r["early"] if e],
                }
                for signal, r in by_signal.items()
            }
            for action, by_signal in runs.items()
        },
    }


def show_signals(results: dict) -> None:
    table = Table(
        title=f"ready signal: poll vs damage, {results['screen'][0]}x{results['screen'][1]}"
    )
    for column in ("action", "signal", "ready_s median", "p90", "early returns", "reset+ready"):
        table.add_column(column)
    for action, by_signal in results["actions"].items():
        for signal, r in by_signal.items():
            s = r["ready_s"]
            table.add_row(
                action,
                signal,
                f"{s['median']:.3f} s",
                f"{s['p90']:.3f} s",
                f"{r['early']}/{s['n']} ({100 * r['early'] / s['n']:.1f}%)",
                fmt(r["reset_to_ready_s"], "s") if "reset_to_ready_s" in r else "",
            )
    Console().print(table)


def fmt(s: dict, unit: str) -> str:
    """A :func:`summary` as ``median unit (min-max, n=N)``."""
    return f"{s['median']:.3g} {unit} ({s['min']:.3g}-{s['max']:.3g}, n={s['n']})"


def results_table(title: str) -> Table:
    """An empty two-column table: measure, median (min-max)."""
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("median (min-max)")
    return table


def show(results: dict) -> None:
    table = results_table(f"local desktop {results['screen'][0]}x{results['screen'][1]}")
    table.add_row("ready probe (grab + compare)", fmt(results["probe_ms"], "ms"))
    for name, s in results["act_ms"].items():
        table.add_row(f"act {name} (HTTP round trip)", fmt(s, "ms"))
    table.add_row("ready_s after typing", fmt(results["ready_after_type"]["ready_s"], "s"))
    table.add_row("wait after typing (client)", fmt(results["ready_after_type"]["wait_s"], "s"))
    table.add_row("observe (grab + PNG + HTTP)", fmt(results["observe_ms"], "ms"))
    table.add_row("PNG size", fmt(results["png_kb"], "KB"))
    for key in ("observe_full", "observe_model"):
        r = results[key]
        table.add_row(
            f"{key} {r['size'][0]}x{r['size'][1]}: wall, server CPU, PNG",
            f"{fmt(r['wall_ms'], 'ms')}, {r['server_cpu_ms']:.1f} ms, {r['png_kb']:.0f} KB",
        )
    for name in ("editor", "terminal"):
        r = results[f"reset_{name}"]
        table.add_row(f"reset-to-ready, {name} task", fmt(r["reset_to_ready_s"], "s"))
        table.add_row(f"  server fast reset ({name})", fmt(r["server_reset_s"], "s"))
        table.add_row(f"  ready_s after reset ({name})", fmt(r["ready_s"], "s"))
    for name, r in results.get("calc", {}).items():
        table.add_row(f"reset-to-ready, calc task, {name}", fmt(r["reset_to_ready_s"], "s"))
        table.add_row(f"  ready_s after reset (calc, {name})", fmt(r["ready_s"], "s"))
    Console().print(table)


def screen_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments of a desktop benchmark: --width, --height (pixels), --n, --json."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    return parser


def main() -> None:
    parser = screen_parser(__doc__)
    parser.add_argument(
        "--calc", action="store_true", help="also LibreOffice Calc (needs libreoffice-calc)"
    )
    parser.add_argument(
        "--chrome", action="store_true", help="--signals: also Chromium (google-chrome)"
    )
    parser.add_argument(
        "--signals", action="store_true", help="only compare the poll and damage ready signals"
    )
    args = parser.parse_args()
    if args.signals:
        results = asyncio.run(
            bench_signals(args.width, args.height, args.n, args.calc, args.chrome)
        )
        show_signals(results)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        return
    results = asyncio.run(bench(args.width, args.height, args.n))
    if args.calc:
        results["calc"] = asyncio.run(bench_calc(args.width, args.height, args.n))
    show(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
