"""Paired reset -> ready of a terminal task: this code's sandboxed desktops against a copy of
an earlier commit's, in one run, taking turns every iteration (machine load hits all alike).

    git archive <commit> | tar -x -C /tmp/before
    PYTHONPATH=$PWD:$PWD/benchmarks python3 benchmarks/bench_sandbox_paired.py \
        --before /tmp/before [--n 30] [--width 1280 --height 720] [--json out.json]

Desktops (all sandboxed, same screen, every server spawned alike with ``PYTHONPATH`` of its
code and attached by URL): ``before`` (the earlier code, on the network its default had,
``host``), ``host`` (this code on the host's network: only the code differs) and ``default``
(this code's server default, ``none``: what ``auto`` gives a terminal task). Per iteration and desktop:
a fast reset -> ready (LocalDesktop.reset + wait_after_reset) and, after the task wrote /etc
through sudo, a revert -> ready; then ``POST /execute`` of ``true``. Medians (min-max).
Needs root, Xvfb, openbox, xterm.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from bench_local_desktop import TERMINAL, fmt, summary

from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.local import open_local_desktops
from legato_pipelines.desktops.local.wire import DEFAULT_TOKEN_ENV, READY_LINE

WRITE_ETC = "echo password | sudo -S sh -c 'echo x > /etc/legato-bench'"


def start_server(code: str, width: int, height: int, token: str, *network: str):
    """A desktop server of the code in ``code`` (``PYTHONPATH``), spawned alike for every
    code under test, and its URL. ``network``: ``--network X``, or nothing for the default."""
    env = dict(os.environ, PYTHONPATH=code, **{DEFAULT_TOKEN_ENV: token})
    argv = [sys.executable, "-m", "legato_pipelines.desktops.local.server"]
    argv += ["--width", str(width), "--height", str(height), *network]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, cwd=code)
    line = proc.stdout.readline()
    if not line.startswith(READY_LINE):
        proc.kill()
        raise SystemExit(f"the server of {code} did not start (exit {proc.wait()})")
    return proc, json.loads(line[len(READY_LINE) :])["url"]


async def to_ready(desktop) -> tuple[float, str]:
    t0 = time.perf_counter()
    await desktop.reset(TERMINAL)
    await desktop.wait_after_reset()
    return time.perf_counter() - t0, desktop.last_reset["kind"]


async def bench(before: str, width: int, height: int, n: int) -> dict:
    token = secrets.token_urlsafe(16)
    here = str(Path(__file__).resolve().parents[1])
    specs = {
        "before": (before, "--network", "host"),  # the earlier code's default network
        "host": (here, "--network", "host"),
        "default": (here,),
    }
    os.environ[DEFAULT_TOKEN_ENV] = token
    procs, desktops = [], {}
    try:
        for name, (code, *network) in specs.items():
            proc, url = start_server(code, width, height, token, *network)
            procs.append(proc)
            config = DesktopConfig(
                backend="local", screen_width=width, screen_height=height, options={"urls": [url]}
            )
            (desktops[name],) = await open_local_desktops(config, 1)
        rows = {name: {"fast": [], "revert": [], "execute": []} for name in desktops}
        order = list(desktops)
        for i in range(n):
            turn = order[i % 3 :] + order[: i % 3]
            for name in turn:
                desktop = desktops[name]
                seconds, kind = await to_ready(desktop)
                assert kind == "fast", (name, kind)
                rows[name]["fast"].append(seconds)
                assert (await desktop.client.execute(WRITE_ETC, shell=True))["returncode"] == 0
                seconds, kind = await to_ready(desktop)
                assert kind == "revert", (name, kind)
                rows[name]["revert"].append(seconds)
                t0 = time.perf_counter()
                await desktop.client.execute(["true"])
                rows[name]["execute"].append(time.perf_counter() - t0)
        networks = {
            name: (await d.client.health())["sandbox"]["network"] for name, d in desktops.items()
        }
        return {
            "screen": [width, height],
            "n": n,
            "networks": networks,
            "reset_terminal_s": {
                name: {k: summary(v) for k, v in r.items() if k != "execute"}
                for name, r in rows.items()
            },
            "execute_true_ms": {name: summary(r["execute"], 1000) for name, r in rows.items()},
        }
    finally:
        for desktop in desktops.values():
            await desktop.close()
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a copy of the earlier commit's tree")
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    results = asyncio.run(bench(args.before, args.width, args.height, args.n))
    for name, network in results["networks"].items():
        resets = results["reset_terminal_s"][name]
        print(
            f"{name:8s} ({network}): fast {fmt(resets['fast'], 's')}  revert {fmt(resets['revert'], 's')}"
            f"  execute `true` {fmt(results['execute_true_ms'][name], 'ms')}"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
