"""Engine ceiling: how many policy steps per second one collector process drives, and how much
collector CPU each step costs, with zero-latency fake desktops (1280x720 PNG screenshots), a
loopback scripted policy server (vLLM wire format, in its own process) and image_max 20.

    python benchmarks/bench_engine.py --desktops 64 1024 --steps 15

Goal (issue 2): <= 3 ms of collector CPU per step. Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CLICK, policy_server_process  # noqa: E402

from legato_pipelines import DesktopConfig, PolicyConfig, collect, load_tasks  # noqa: E402
from legato_pipelines.desktops.fake import frame_pool  # noqa: E402

BASELINE_RSS = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run(url: str, desktops: int, steps: int, image_max: int, attempts_per_desktop: int) -> dict:
    tasks = load_tasks(
        [
            {
                "task_id": f"t{i:05d}",
                "config": {"instruction": f"Benchmark task {i}", "fake": {"success": 0.5}},
            }
            for i in range(desktops * attempts_per_desktop // 4)
        ]
    )
    frame_pool(1280, 720, frames=32)  # pre-render outside the measurement
    with tempfile.TemporaryDirectory() as out:
        t0, c0 = time.perf_counter(), cpu_s()
        summary = collect(
            tasks,
            PolicyConfig(base_url=url, model="scripted-qwen", version="bench"),
            out,
            desktops=desktops,
            desktop=DesktopConfig(backend="fake"),
            group=4,
            max_steps=steps,
            image_max=image_max,
            max_inflight=desktops,
        )
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
        disk = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    n = summary["steps"]
    return {
        "bench": "engine_ceiling",
        "desktops": desktops,
        "steps": n,
        "wall_s": round(wall, 2),
        "steps_per_s": round(n / wall, 1),
        "collector_cpu_ms_per_step": round(cpu / n * 1000, 3),
        "model_call_p50_s": summary["model_call_s"]["p50"],
        "records": summary["records"],
        "disk_bytes_per_step": int(disk / n),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--desktops", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--image-max", type=int, default=20)
    ap.add_argument("--attempts-per-desktop", type=int, default=4)
    args = ap.parse_args()
    script = Path(tempfile.mkdtemp()) / "script.json"
    script.write_text(
        json.dumps({"default": [CLICK]})
    )  # never terminates: every attempt runs --steps steps
    with policy_server_process("--script", str(script)) as url:
        for n in args.desktops:
            print(
                json.dumps(run(url, n, args.steps, args.image_max, args.attempts_per_desktop)),
                flush=True,
            )


if __name__ == "__main__":
    main()
