"""What the web recorder adds to a step's wall time (issue 34: at most 10%).

    PYTHONPATH=. python benchmarks/bench_web_recorder.py [--n 15] [--json out.json]

Two real sandboxed desktops (1280x720, ``network=host``: the stand-in is on this host's
loopback, which ``own`` desktops do not reach, nor the host's own address: measured, refused),
each with Chromium on a stand-in gallery (``tests/web_standin.py``: HTTPS with a local CA; one
page and 24 images, ``Cache-Control: no-store``): one live (Chromium reaches the site itself,
``web_hosts`` + ``web_ca``; the second Chromium cannot hold DevTools' port 1337, unused
here), one recording (``web=record:ARCHIVE``: Chromium ->
mitmdump in the desktop's network -> the site, every exchange written to the flow file). A
step is what the engine does per action: ``act`` + ``wait_after_action`` (the ready wait) +
``observe`` at 1280x720, of two kinds (:data:`STEPS`): F5 (the page and its 24 images fetched
again) and Down (a scroll: no request); the two desktops take turns step by step so the
machine's load hits both alike. Prints medians (min-max) and
the ratio record / live. Needs root, Xvfb, openbox, Chromium, certutil, the web venv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from legato_pipelines.actions import Action
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.server import open_local_desktops
from legato_pipelines.tasks import Task
from tests.web_standin import NAME, make_ca, serve_standin


def gallery_task() -> Task:
    url = f"https://{NAME}/gallery?bench"
    config = {
        "instruction": "x",
        "config": [{"type": "launch", "parameters": {"command": ["google-chrome", url]}}],
        "evaluator": {"func": "infeasible"},
    }
    return Task(task_id="gallery", domain="chrome", config=config, source="bench")


#: The steps measured: a reload (the page and its 24 images fetched again: 25 requests
#: through the recorder) and a scroll (no request: the recorder idle).
STEPS = {"reload": ["F5"], "scroll": ["Down"]}


async def step(desktop, keys: list[str]) -> float:
    t0 = time.perf_counter()
    action = Action(action="key", keys=keys)
    await desktop.act(action)
    await desktop.wait_after_action(action)
    await desktop.observe((1280, 720))
    return time.perf_counter() - t0


async def main(n: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="bench-web-"))
    ca, cert, key = make_ca(folder / "ca")
    address = "127.0.0.1"
    with serve_standin(cert, key, host=address) as site:
        common = {
            "network": "host",
            "cache_dir": "",
            "web_hosts": {NAME: f"{address}:{site.port}"},
            "web_ca": [str(ca)],
        }
        modes = {"live": common, "record": {**common, "web": f"record:{folder / 'archive'}"}}
        desktops = {}
        for mode, options in modes.items():
            config = DesktopConfig(
                backend="local", screen_width=1280, screen_height=720, options=options
            )
            (desktops[mode],) = await open_local_desktops(config, 1)
        try:
            for desktop in desktops.values():
                await desktop.reset(gallery_task())
                await desktop.wait_after_reset()
                for _ in range(2):  # warm: the browser's first loads
                    await step(desktop, STEPS["reload"])
            times: dict[str, list[float]] = {}
            fetched = {}
            for kind, keys in STEPS.items():
                served = len(site.requests)
                for i in range(n):
                    order = list(desktops) if i % 2 == 0 else list(reversed(desktops))
                    for mode in order:
                        times.setdefault(f"{kind} {mode}", []).append(
                            await step(desktops[mode], keys)
                        )
                fetched[kind] = (len(site.requests) - served) / (2 * n)
        finally:
            for desktop in desktops.values():
                await desktop.close()
    flows = sorted((folder / "archive").glob("*.flows"))
    out = {
        mode: {
            "median_s": statistics.median(v),
            "min_s": min(v),
            "max_s": max(v),
        }
        for mode, v in times.items()
    }
    for kind in STEPS:
        out[f"{kind} ratio record/live"] = (
            out[f"{kind} record"]["median_s"] / out[f"{kind} live"]["median_s"]
        )
        out[f"{kind} site requests per step"] = fetched[kind]
    out["archive_bytes"] = sum(f.stat().st_size for f in flows)
    out["n"] = n
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = asyncio.run(main(args.n))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    for kind in STEPS:
        for mode in ("live", "record"):
            r = result[f"{kind} {mode}"]
            low, high = r["min_s"] * 1000, r["max_s"] * 1000
            print(f"{kind:6s} {mode:6s} {r['median_s'] * 1000:6.0f} ms ({low:.0f}-{high:.0f})")
        ratio = result[f"{kind} ratio record/live"]
        per_step = result[f"{kind} site requests per step"]
        print(f"{kind:6s} record/live {ratio:.3f} (site requests per step {per_step:.1f})")
    print(f"archive {result['archive_bytes']} bytes, n={result['n']}")
