"""Reset -> ready on two sandboxed desktops taking turns, one served by this checkout's code and
one by another checkout's (a baseline: ``git archive BASE | tar -x -C DIR``): of a terminal
task, or of OSWorld tasks that open an app.

    PYTHONPATH=$PWD:$PWD/benchmarks python3 benchmarks/bench_reset_paired.py --other DIR [--n 40]
        [--network host|none|own] [--other-network host|none|own]
        [--session plain|vm] [--other-session plain|vm] [--apps all | calc gimp ...]

``--other $PWD --session vm --other-session plain`` pairs this checkout's two desktop sessions
(docs/local-desktop.md §18). After each task's last pair each child reports its desktop's PSS
(the server and every process under it: Xvfb, window manager, panels, sandbox, bus, the xterm
or the app; not the osworld worker that runs an app task's setup).

Each desktop lives in a child process of its own whose ``PYTHONPATH`` names its checkout (the
desktop servers of one event loop are forked from one template, which imports the package
once, so two checkouts cannot share a process; the benchmark modules are this checkout's in
both, as a script's own directory comes first on ``sys.path``). The two alternate reset by
reset (who goes first alternates too), so machine load hits both alike, and every pair gives
a ratio (this / other). Without ``--apps`` each step is LocalDesktop.reset (a fast reset: the
previous attempt left its xterm) + the ready wait + launching xterm, as in bench_sandbox.py's
``reset``. ``--apps`` names the tasks: ``xterm`` (that one) and the apps of bench_apps.py's
``APP_TASKS`` (first word), ``all`` for each of them. A step of an app is bench_apps.py's: a
key press, then the timed reset to the app's OSWorld task (its setup run by the osworld
worker, OSWorld's SetupController in its venv: downloads from a file cache bench_apps.py
builds, the app launched) + the ready wait. Per task one reset on each desktop comes first,
not counted (an app's first start). Pairs where a reset was not a fast one (or raised) are
left out and listed. Prints per task the medians, the median of the per-pair ratios with its
quartiles, and PSS per desktop. Needs root (sandboxes), Xvfb, openbox, xterm, the apps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

#: the task name of the terminal task (bench_local_desktop.py's xterm), the default
XTERM = "xterm"


async def serve(width: int, height: int, network: str, session: str, cache_dir: str) -> None:
    """Child: open one sandboxed desktop (file cache ``cache_dir`` when given); for each line
    ``reset <task>`` on stdin (:data:`XTERM` or an app of bench_apps.APP_TASKS), one reset ->
    ready, answered ``<seconds> <reset kind>`` (``error <message>`` when it raised); for a line
    ``pss``, ``pss <MB>`` of the desktop (the server's process tree)."""
    from bench_apps import app_tasks, used_reset
    from bench_local_batch import descendants, pss_mb
    from bench_local_desktop import TERMINAL
    from bench_sandbox import open_one, reset_to_ready

    import legato_pipelines

    extra = {"session": session} if session != "plain" else {}  # older checkouts lack it
    if cache_dir:
        extra["cache_dir"] = cache_dir
    tasks = app_tasks() if cache_dir else {}
    desktop = await open_one(width, height, sandbox=True, network=network, **extra)
    try:
        print("ready", legato_pipelines.__file__, flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command, _, name = line.strip().partition(" ")
            if command == "pss":
                server = desktop.server.pid
                print("pss", pss_mb([server, *descendants(server)]), flush=True)
                continue
            try:
                if name == XTERM:
                    seconds, kind = await reset_to_ready(desktop, TERMINAL)
                else:
                    seconds = await used_reset(desktop, tasks[name])
                    kind = desktop.last_reset["kind"]
            except Exception as exc:  # noqa: BLE001 - the parent counts it and goes on
                print("error", f"{type(exc).__name__}: {exc}"[:300].replace("\n", " "), flush=True)
                continue
            print(seconds, kind, flush=True)
    finally:
        await desktop.close()


def child(
    path: str, width: int, height: int, network: str, session: str, cache_dir: str
) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{path}:{path}/benchmarks")
    argv = [sys.executable, __file__, "--serve", "--width", str(width), "--height", str(height)]
    argv += ["--network", network, "--session", session, "--cache-dir", cache_dir]
    # cwd: ``python -m`` (the desktop server) puts it first on sys.path
    proc = subprocess.Popen(
        argv, env=env, cwd=path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline().split()
    if not line or line[0] != "ready":
        raise RuntimeError(f"the desktop of {path} did not start")
    if not line[1].startswith(str(Path(path).resolve())):
        raise RuntimeError(f"the desktop of {path} imported {line[1]}")
    return proc


def ask(proc: subprocess.Popen, line: str) -> list[str]:
    """Send ``line`` to a child, return its answer's words."""
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    answer = proc.stdout.readline().strip().split(maxsplit=1)
    if not answer:
        raise RuntimeError(f"a child ended (exit code {proc.wait(60)}) after {line!r}")
    return answer


def pairs(children: dict[str, subprocess.Popen], task: str, n: int) -> dict:
    """One reset to ``task`` on each child (not counted), then ``n`` pairs of resets taking
    turns; then each child's PSS. Returns the medians, the per-pair ratios' median and
    quartiles, the pairs left out (a reset not fast, or one that raised) and the times."""
    for proc in children.values():
        ask(proc, f"reset {task}")  # the app's first start on this desktop
    times: dict[str, list[float]] = {"this": [], "other": []}
    left_out: list[str] = []
    for i in range(n):
        pair = {}
        for name in ("this", "other") if i % 2 == 0 else ("other", "this"):
            pair[name] = ask(children[name], f"reset {task}")
        bad = {k: v for k, v in pair.items() if v[0] == "error" or v[1] != "fast"}
        if bad:
            left_out.append(" ".join(f"{k}: {' '.join(v)}" for k, v in bad.items()))
            continue
        for name, (seconds, _kind) in pair.items():
            times[name].append(float(seconds))
    result: dict = {"pairs": len(times["this"]), "left_out": left_out}
    result["pss_mb"] = {name: float(ask(proc, "pss")[1]) for name, proc in children.items()}
    if times["this"]:
        ratios = [a / b for a, b in zip(times["this"], times["other"], strict=True)]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        result |= {
            "this_median_s": statistics.median(times["this"]),
            "other_median_s": statistics.median(times["other"]),
            "ratio_median": statistics.median(ratios),
            "ratio_quartiles": [quartiles[0], quartiles[2]],
        }
    return result | {"times": times}


def summary(task: str, r: dict) -> str:
    """One line of a task's results (:func:`pairs`)."""
    line = f"  {task}: {r['pairs']} pairs"
    if r["pairs"]:
        q1, q3 = r["ratio_quartiles"]
        line += (
            f", this {r['this_median_s']:.3f} s, other {r['other_median_s']:.3f} s, median"
            f" ratio this/other {r['ratio_median']:.3f} [quartiles {q1:.3f}-{q3:.3f}]"
        )
    line += f"; PSS MB {r['pss_mb']}"
    if r["left_out"]:
        line += f"; left out: {r['left_out']}"
    return line


def bench(
    other: str,
    n: int,
    width: int,
    height: int,
    networks: tuple[str, str],
    sessions: tuple[str, str] = ("plain", "plain"),
    apps: list[str] | None = None,
) -> dict:
    """``n`` pairs per task: the terminal task, or each of ``apps`` (names of APP_TASKS)."""
    here = str(Path(__file__).resolve().parents[1])
    cache_dir = ""
    if apps:
        from bench_apps import app_tasks, filled_cache

        cache_dir = str(filled_cache(app_tasks().values()))
    children = {
        "this": child(here, width, height, networks[0], sessions[0], cache_dir),
        "other": child(other, width, height, networks[1], sessions[1], cache_dir),
    }
    results: dict = {}
    try:
        for task in apps or [XTERM]:
            results[task] = pairs(children, task, n)
            print(summary(task, results[task]), flush=True)
    finally:
        for proc in children.values():
            proc.stdin.close()
            proc.wait(60)
    return {
        "n": n,
        "screen": [width, height],
        "networks": {"this": networks[0], "other": networks[1]},
        "sessions": {"this": sessions[0], "other": sessions[1]},
        "tasks": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", help="the other checkout (its package root)")
    parser.add_argument("--n", type=int, default=40, help="pairs per task")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--network", default="host", help="this checkout's desktop network")
    parser.add_argument(
        "--other-network", default="host", help="the other checkout's (e.g. its old default)"
    )
    parser.add_argument("--session", default="plain", help="this checkout's desktop session")
    parser.add_argument("--other-session", default="plain", help="the other checkout's")
    parser.add_argument(
        "--apps",
        nargs="*",
        help="tasks: xterm and bench_apps.py's apps (first word), or all (xterm and every app)",
    )
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.width, args.height, args.network, args.session, args.cache_dir))
        return
    if not args.other:
        parser.error("--other is required")
    apps = None
    if args.apps is not None:
        from bench_apps import APP_TASKS

        wanted = set(args.apps)
        every = "all" in wanted
        apps = [a for a in [XTERM, *APP_TASKS] if every or a.split()[0] in wanted]
        if not apps:
            parser.error(f"--apps: none of {sorted(wanted)} in {list(APP_TASKS)} (or all)")
    networks = (args.network, args.other_network)
    sessions = (args.session, args.other_session)
    print(
        f"reset -> ready, fast, {args.width}x{args.height} (n={args.n} pairs per task, networks"
        f" {networks}, sessions {sessions}), as each task ends:",
        flush=True,
    )
    results = bench(args.other, args.n, args.width, args.height, networks, sessions, apps)
    print("all tasks:")
    for task, r in results["tasks"].items():
        print(summary(task, r))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
