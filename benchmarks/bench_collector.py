"""Collector CPU per step with a new real-size screenshot every step (issue 18), measured on
``legato collect`` as a user runs it: a new process, fake desktops, the scripted policy server
in a process of its own (vLLM wire format, loopback).

    python benchmarks/bench_collector.py --desktops 64 1024 --screens 1280x720 1920x1080

For each (desktops D, screen WxH) it runs ``legato collect --backend fake --desktops D --screen
WxH --desktop-option unique=true --max-steps 15`` twice: with D attempts (D/4 tasks x group 4)
and with 2D attempts; every attempt takes 15 steps (the script never terminates) and every
observation is a distinct PNG. The collector's CPU is the child process's user + system time
(``os.wait4``), threads included:

- marginal CPU per step = (cpu(2D) - cpu(D)) / (steps(2D) - steps(D)): start-up excluded;
- fixed CPU = cpu(D) - marginal x steps(D) (the intercept): imports, desktops up, the policy
  check, the run directory, the summary, the screens the fake desktops draw and encode (once
  per process), and whatever the first wave costs more than later ones (the heap growing to
  its plateau: page faults);
- fixed CPU, direct = cpu of a batch of D one-step attempts - marginal x D.

``--big`` sets the second batch (default 2: 2D attempts).

``--desktop-side`` also times what a desktop spends to hand out the model-size PNG of one
observation from raw screen pixels (a real frame from ``--frame PNG``, else the fake's): the
local desktop server does this in its own process, once per observation.

Prints one JSON line per run and one summary line per (D, screen) with the medians over
``--repeats``. Run directories go under ``--workdir`` (default: the system's temporary
directory); the file-creation cost there is probed and printed (``create_us``), since a step
creates its screenshot's and its messages' files and that cost is the disk's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CLICK, policy_server_process  # noqa: E402

STEPS = 15
GROUP = 4


def tasks_file(directory: Path, n: int) -> Path:
    path = directory / f"tasks-{n}.json"
    if not path.exists():
        tasks = [
            {
                "task_id": f"t{i:05d}",
                "config": {"instruction": f"Task {i}", "fake": {"success": 0.5}},
            }
            for i in range(n)
        ]
        path.write_text(json.dumps(tasks))
    return path


def run_collect(
    url: str,
    desktops: int,
    attempts: int,
    screen: str,
    workdir: Path,
    extra: list[str],
    steps: int = STEPS,
) -> dict:
    """One ``legato collect`` process; its CPU (user, sys) from wait4, steps from its summary."""
    out = Path(tempfile.mkdtemp(prefix="bench-collector-", dir=workdir))
    cmd = [
        sys.executable, "-m", "legato_pipelines", "collect", "--backend", "fake",
        "--desktops", str(desktops), "--tasks", str(tasks_file(workdir, attempts // GROUP)),
        "--group", str(GROUP), "--max-steps", str(steps), "--screen", screen,
        "--desktop-option", "unique=true", "--policy-url", url, "--model", "scripted-qwen",
        "--out", str(out / "run"), "--no-progress", "--json", *extra,
    ]  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as stdout:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr = proc.stderr.read().decode(errors="replace")
        stdout.seek(0)
        text = stdout.read().decode()
    if proc.returncode != 0:
        raise RuntimeError(f"legato collect failed ({proc.returncode}): {stderr[-2000:]}")
    summary = json.loads(text)
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return {
        "desktops": desktops, "attempts": attempts, "screen": screen, "steps": summary["steps"],
        "user_s": round(usage.ru_utime, 3), "sys_s": round(usage.ru_stime, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "wall_s": round(wall, 2),
        "model_call_p50_s": summary["model_call_s"]["p50"], "minflt": usage.ru_minflt,
        "maxrss_mb": usage.ru_maxrss // 1024,
        "not_ok": {k: v for k, v in summary["counts"].items() if v and k != "ok"},
    }  # fmt: skip


def create_cost_us(workdir: Path, n: int = 200) -> float:
    """CPU microseconds to create (and fill with 60 KB) one new file under ``workdir``: the
    disk's part of storing a screenshot."""
    import resource

    data = os.urandom(60_000)
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        before = resource.getrusage(resource.RUSAGE_SELF)
        for i in range(n):
            Path(d, f"{i:064x}.png").write_bytes(data)
        after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return round(cpu / n * 1e6, 1)


def desktop_side(screen: str, frame: Path | None, repeats: int = 20) -> dict:
    """CPU milliseconds per observation to make the model-size PNG from raw BGRX pixels (what
    the local desktop server does) and, for comparison, to decode + resize + encode a PNG of
    the whole screen (what the collector did before)."""
    from PIL import Image

    from legato_pipelines.desktops.backends.fake import frame_pool
    from legato_pipelines.harness.resize import QWEN3VL_RESIZE
    from legato_pipelines.images import Screenshot, resized_png

    width, height = (int(v) for v in screen.split("x"))
    if frame is not None:
        source = Image.open(frame).convert("RGB").resize((width, height))
    else:
        source = frame_pool(width, height, frames=1)[0].to_pil().convert("RGB")
    raw = source.convert("RGBX").tobytes("raw", "BGRX")  # what an X server hands out
    size = QWEN3VL_RESIZE.size(width, height)
    full = Screenshot.from_pil(source)

    def per_call(fn) -> float:
        t0 = time.process_time()
        for _ in range(repeats):
            fn()
        return round((time.process_time() - t0) / repeats * 1000, 2)

    def from_raw() -> bytes:
        return resized_png(Image.frombuffer("RGB", (width, height), raw, "raw", "BGRX", 0, 1), size)

    return {
        "bench": "desktop_side", "screen": screen, "model_size": list(size),
        "raw_to_model_png_ms": per_call(from_raw),
        "collector_path_ms": per_call(lambda: resized_png(Screenshot(full.png).to_pil(), size)),
        "model_png_bytes": len(from_raw()),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--desktops", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--screens", nargs="+", default=["1280x720", "1920x1080"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--big", type=float, default=2.0, help="second batch: BIG x D attempts")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--desktop-side", action="store_true", help="also time the desktop's part")
    ap.add_argument("--frame", type=Path, help="a real screenshot for --desktop-side")
    ap.add_argument(
        "--collect-arg", action="append", default=[], help="extra `legato collect` argument"
    )
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    script = Path(tempfile.mkdtemp()) / "script.json"
    script.write_text(json.dumps({"default": [CLICK]}))  # never terminates: 15 steps each
    print(json.dumps({"bench": "workdir", "path": str(args.workdir), "create_us": create_cost_us(args.workdir)}), flush=True)  # fmt: skip
    with policy_server_process("--script", str(script)) as url:
        for desktops in args.desktops:
            for screen in args.screens:
                marginal, fixed, direct = [], [], []
                big_attempts = int(round(args.big * desktops / GROUP)) * GROUP
                for _ in range(args.repeats):
                    rows = [
                        run_collect(url, desktops, n, screen, args.workdir, args.collect_arg, steps)
                        for n, steps in ((desktops, STEPS), (big_attempts, STEPS), (desktops, 1))
                    ]
                    for row in rows:
                        print(json.dumps({"bench": "collect", **row}), flush=True)
                    small, big, one = rows
                    m = (big["cpu_s"] - small["cpu_s"]) / (big["steps"] - small["steps"])
                    marginal.append(m)
                    fixed.append(small["cpu_s"] - m * small["steps"])
                    direct.append(one["cpu_s"] - m * one["steps"])
                print(
                    json.dumps(
                        {
                            "bench": "collector_cpu", "desktops": desktops, "screen": screen,
                            "marginal_ms_per_step": round(statistics.median(marginal) * 1000, 3),
                            "fixed_cpu_s": round(statistics.median(fixed), 3),
                            "fixed_cpu_direct_s": round(statistics.median(direct), 3),
                            "runs": [round(m * 1000, 3) for m in marginal],
                        }
                    ),
                    flush=True,
                )  # fmt: skip
    if args.desktop_side:
        for screen in args.screens:
            print(json.dumps(desktop_side(screen, args.frame)), flush=True)


if __name__ == "__main__":
    main()
