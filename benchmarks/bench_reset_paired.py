"""Reset -> ready of a terminal task on two sandboxed desktops taking turns, one served by this
checkout's code and one by another checkout's (a baseline: ``git archive BASE | tar -x -C DIR``).

    PYTHONPATH=$PWD:$PWD/benchmarks python3 benchmarks/bench_reset_paired.py --other DIR [--n 40]
        [--network host|none|own] [--other-network host|none|own]
        [--session plain|vm] [--other-session plain|vm]

``--other $PWD --session vm --other-session plain`` pairs this checkout's two desktop sessions
(docs/local-desktop.md §18). After the last pair each child reports its desktop's PSS (the
server and every process under it: Xvfb, window manager, panels, sandbox, bus, the xterm).

Each desktop lives in a child process of its own whose ``PYTHONPATH`` names its checkout (the
desktop servers of one event loop are forked from one template, which imports the package
once, so two checkouts cannot share a process). The two alternate reset by reset (who goes
first alternates too), so machine load hits both alike, and every pair gives a ratio (this /
other). Each step is LocalDesktop.reset (a fast reset: the previous attempt left its xterm) +
the ready wait + launching xterm, as in bench_sandbox.py's ``reset``. Prints the medians and
the median of the per-pair ratios. Needs root (sandboxes), Xvfb, openbox, xterm.
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


async def serve(width: int, height: int, network: str, session: str) -> None:
    """Child: open one sandboxed desktop; for each line on stdin, one reset -> ready of the
    terminal task; answer ``<seconds> <reset kind>`` on stdout; at the end of stdin,
    ``pss <MB>`` of the desktop (the server's process tree)."""
    from bench_local_batch import descendants, pss_mb
    from bench_local_desktop import TERMINAL
    from bench_sandbox import open_one, reset_to_ready

    import legato_pipelines

    extra = {"session": session} if session != "plain" else {}  # older checkouts lack it
    desktop = await open_one(width, height, sandbox=True, network=network, **extra)
    try:
        await reset_to_ready(desktop, TERMINAL)  # warm-up: the first reset has no xterm
        print("ready", legato_pipelines.__file__, flush=True)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            seconds, kind = await reset_to_ready(desktop, TERMINAL)
            print(seconds, kind, flush=True)
        server = desktop.server.pid
        print("pss", pss_mb([server, *descendants(server)]), flush=True)
    finally:
        await desktop.close()


def child(path: str, width: int, height: int, network: str, session: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{path}:{path}/benchmarks")
    argv = [sys.executable, __file__, "--serve", "--width", str(width), "--height", str(height)]
    argv += ["--network", network, "--session", session]
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


def bench(
    other: str,
    n: int,
    width: int,
    height: int,
    networks: tuple[str, str],
    sessions: tuple[str, str] = ("plain", "plain"),
) -> dict:
    here = str(Path(__file__).resolve().parents[1])
    children = {
        "this": child(here, width, height, networks[0], sessions[0]),
        "other": child(other, width, height, networks[1], sessions[1]),
    }
    times: dict[str, list[float]] = {"this": [], "other": []}
    pss: dict[str, float] = {}
    try:
        for i in range(n):
            for name in ("this", "other") if i % 2 == 0 else ("other", "this"):
                proc = children[name]
                proc.stdin.write("go\n")
                proc.stdin.flush()
                seconds, kind = proc.stdout.readline().split()
                if kind != "fast":
                    raise RuntimeError(f"{name}: a {kind} reset, not a fast one")
                times[name].append(float(seconds))
    finally:
        for name, proc in children.items():
            proc.stdin.close()
            answer = proc.stdout.readline().split()
            if answer[:1] == ["pss"]:
                pss[name] = float(answer[1])
            proc.wait(60)
    ratios = [a / b for a, b in zip(times["this"], times["other"], strict=True)]
    return {
        "n": n,
        "networks": {"this": networks[0], "other": networks[1]},
        "sessions": {"this": sessions[0], "other": sessions[1]},
        "pss_mb": pss,
        "this_median_s": statistics.median(times["this"]),
        "other_median_s": statistics.median(times["other"]),
        "ratio_median": statistics.median(ratios),
        "times": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", help="the other checkout (its package root)")
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--network", default="host", help="this checkout's desktop network")
    parser.add_argument(
        "--other-network", default="host", help="the other checkout's (e.g. its old default)"
    )
    parser.add_argument("--session", default="plain", help="this checkout's desktop session")
    parser.add_argument("--other-session", default="plain", help="the other checkout's")
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.width, args.height, args.network, args.session))
        return
    if not args.other:
        parser.error("--other is required")
    networks = (args.network, args.other_network)
    sessions = (args.session, args.other_session)
    results = bench(args.other, args.n, args.width, args.height, networks, sessions)
    print(
        f"reset -> ready, terminal, fast (n={results['n']} pairs, networks {networks}, sessions"
        f" {sessions}): this {results['this_median_s']:.3f} s, other"
        f" {results['other_median_s']:.3f} s, median ratio this/other"
        f" {results['ratio_median']:.3f}; PSS MB {results['pss_mb']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
