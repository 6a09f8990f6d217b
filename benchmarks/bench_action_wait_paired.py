"""The action ready wait with a launched app open, this checkout against another (a baseline:
``git archive main | tar -x -C DIR``), paired.

    PYTHONPATH=$PWD python3 benchmarks/bench_action_wait_paired.py --other DIR [--n 30]
        [--width 1920 --height 1080] [--app libreoffice --calc] [--session vm]

Starts one desktop server per checkout (each ``python -m`` with its own ``PYTHONPATH``),
launches the app on both through ``/setup/launch`` (so it is an app the server waits for),
waits for it, then alternates (who goes first alternates too): a ``shift`` press
(``/legato/act``, draws nothing) and ``/legato/wait`` mode ``action``. Prints the median
``ready_s`` of each and the median of the per-pair ratios (this / other). Needs root, Xvfb,
openbox and the app.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics

from legato_pipelines.actions import Action
from tests.desktop_local_support import RunningServer


async def main_async(args) -> dict:
    here = os.environ.get("PYTHONPATH", os.getcwd())
    servers = {}
    try:
        for name, path in (("this", here), ("other", args.other)):
            os.environ["PYTHONPATH"] = path  # the server's own package
            servers[name] = RunningServer(
                args.width, args.height, extra_args=("--session", args.session)
            )
        os.environ["PYTHONPATH"] = here
        clients = {name: s.client() for name, s in servers.items()}
        for c in clients.values():
            await c.reset()
            await c.launch(args.app)
            await c.wait("reset", timeout_s=60)
        out: dict[str, list[float]] = {"this": [], "other": []}
        for i in range(args.n):
            for name in ("this", "other") if i % 2 == 0 else ("other", "this"):
                await clients[name].act(Action(action="key", keys=("shift",)))
                out[name].append(float((await clients[name].wait("action"))["ready_s"]))
        for c in clients.values():
            await c.aclose()
    finally:
        for s in servers.values():
            s.stop()
    return {
        "n": args.n,
        "app": args.app,
        "session": args.session,
        "median_ready_s": {k: statistics.median(v) for k, v in out.items()},
        "median_ratio": statistics.median(
            a / b for a, b in zip(out["this"], out["other"], strict=True)
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--other", required=True, help="the other checkout (its package root)")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--app", nargs="+", default=["libreoffice", "--calc"])
    ap.add_argument("--session", default="plain", choices=("plain", "vm"))
    print(json.dumps(asyncio.run(main_async(ap.parse_args()))))


if __name__ == "__main__":
    main()
