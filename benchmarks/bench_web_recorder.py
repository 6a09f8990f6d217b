"""What the web recorder adds to a step's wall time (issue 34: at most 10%).

    PYTHONPATH=. python benchmarks/bench_web_recorder.py [--n 15] [--policy-latency S]
        [--site h1|h2] [--json out.json]

Two real sandboxed desktops (1280x720, ``network=host``: the stand-in is on this host's
loopback, which ``own`` desktops do not reach, nor the host's own address: measured, refused),
each with Chromium on a stand-in gallery (``tests/web_standin.py``: HTTPS with a local CA; one
page and 24 images, ``Cache-Control: no-store``): one live (Chromium reaches the site itself,
``web_hosts`` + ``web_ca``; the second Chromium cannot hold DevTools' port 1337, unused
here), one recording (``web=record:ARCHIVE``: Chromium -> ``legato-web-recorder`` in the
desktop's network -> the site, every exchange written as it finishes). A
step is what the engine does per action: ``act`` + ``wait_after_action`` (the ready wait) +
``observe`` at 1280x720, of two kinds (:data:`STEPS`): F5 (the page and its 24 images fetched
again) and Down (a scroll: no request); the two desktops take turns step by step so the
machine's load hits both alike. Prints medians (min-max), the ratio record / live and the
recorder's CPU per step (the recorder's user + system time, read from ``/proc``: less noisy
than the wall times on a loaded machine). ``--policy-latency S`` measures a third kind too,
labelled as such: the reload preceded by ``S`` seconds of sleep standing in for the policy's
call (the engine's step as a whole; the sleep is no model call: no CPU, no network). Needs
root, Xvfb, openbox, Chromium, certutil, the web venv. ``--site h2``: the stand-in served by
mitmdump (``tests/web_standin_h2.py``), which speaks HTTP/2 to Chromium and to the recorder
as most real sites do (the default ``h1``, Python's ``http.server``, speaks HTTP/1.1 only).
The recorder speaks HTTP/1.1 to both sides either way. Before the recorder was
``legato-web-recorder`` it was mitmdump: run this file from an older checkout (PYTHONPATH)
for that side; :func:`recorder_pid` finds either.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from legato_pipelines.actions import Action
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.server import open_local_desktops
from legato_pipelines.tasks import Task
from tests.web_standin import NAME, make_ca, serve_standin, serve_standin_h2


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


RECORDERS = ("legato-web-recorder", "mitmdump")


def recorder_pid(server_pid: int) -> int:
    """The recording process (:data:`RECORDERS`: what bwrap and setpriv run) among the
    descendants of the desktop server ``server_pid``."""
    todo = [server_pid]
    while todo:
        pid = todo.pop()
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if any(Path(arg).name in RECORDERS for arg in argv[:2]):
                return pid
            for task in os.listdir(f"/proc/{pid}/task"):
                todo += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        except OSError:
            continue
    raise RuntimeError(f"no recorder under the desktop server {server_pid}")


def cpu_s(pid: int) -> float:
    """``pid``'s user + system CPU time so far (s; ``/proc/PID/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def step(desktop, keys: list[str], policy_s: float = 0.0) -> float:
    t0 = time.perf_counter()
    if policy_s:
        await asyncio.sleep(policy_s)  # stands in for the policy's call
    action = Action(action="key", keys=keys)
    await desktop.act(action)
    await desktop.wait_after_action(action)
    await desktop.observe((1280, 720))
    return time.perf_counter() - t0


async def main(n: int, policy_latency: float = 0.0, site_http: str = "h1") -> dict:
    kinds = {kind: (keys, 0.0) for kind, keys in STEPS.items()}
    if policy_latency:
        kinds[f"reload+policy {policy_latency:g}s"] = (STEPS["reload"], policy_latency)
    folder = Path(tempfile.mkdtemp(prefix="bench-web-"))
    ca, cert, key = make_ca(folder / "ca")
    address = "127.0.0.1"
    serve = serve_standin_h2 if site_http == "h2" else serve_standin
    with serve(cert, key, host=address) as site:
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
            fetched, cpu = {}, {}
            mitm = recorder_pid(desktops["record"].server.pid)
            for kind, (keys, policy_s) in kinds.items():
                served, used = len(site.requests), cpu_s(mitm)
                for i in range(n):
                    order = list(desktops) if i % 2 == 0 else list(reversed(desktops))
                    for mode in order:
                        times.setdefault(f"{kind} {mode}", []).append(
                            await step(desktops[mode], keys, policy_s)
                        )
                fetched[kind] = (len(site.requests) - served) / (2 * n)
                cpu[kind] = (cpu_s(mitm) - used) / n
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
    for kind in kinds:
        out[f"{kind} ratio record/live"] = (
            out[f"{kind} record"]["median_s"] / out[f"{kind} live"]["median_s"]
        )
        out[f"{kind} site requests per step"] = fetched[kind]
        out[f"{kind} recorder cpu per step s"] = cpu[kind]
    out["kinds"] = list(kinds)
    out["archive_bytes"] = sum(f.stat().st_size for f in flows)
    out["site"] = site_http
    out["n"] = n
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=15)
    parser.add_argument("--policy-latency", type=float, default=0.0, help="s (0: none)")
    parser.add_argument("--site", choices=("h1", "h2"), default="h1")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = asyncio.run(main(args.n, args.policy_latency, args.site))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    for kind in result["kinds"]:
        for mode in ("live", "record"):
            r = result[f"{kind} {mode}"]
            low, high = r["min_s"] * 1000, r["max_s"] * 1000
            print(f"{kind:6s} {mode:6s} {r['median_s'] * 1000:6.0f} ms ({low:.0f}-{high:.0f})")
        ratio = result[f"{kind} ratio record/live"]
        per_step = result[f"{kind} site requests per step"]
        used = result[f"{kind} recorder cpu per step s"] * 1000
        print(
            f"{kind:6s} record/live {ratio:.3f} (site requests per step {per_step:.1f}, "
            f"recorder CPU per step {used:.0f} ms)"
        )
    print(f"archive {result['archive_bytes']} bytes, n={result['n']}, site {result['site']}")
