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

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CLICK, policy_server_process  # noqa: E402

from legato_pipelines import DesktopConfig, PolicyConfig, collect, load_tasks  # noqa: E402
from legato_pipelines.desktops.fake import frame_pool  # noqa: E402

BASELINE_RSS = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


BASELINE_RSS = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run(
    url: str,
    desktops: int,
    steps: int,
    image_max: int,
    attempts_per_desktop: int,
    unique: bool = False,
    height: int = 720,
) -> dict:
    tasks = load_tasks(
        [
            {
                "task_id": f"t{i:05d}",
                "config": {"instruction": f"Benchmark task {i}", "fake": {"success": 0.5}},
            }
            for i in range(desktops * attempts_per_desktop // 4)
        ]
    )
    frame_pool(1280, height, frames=32)  # pre-render outside the measurement
    with tempfile.TemporaryDirectory() as out:
        t0, c0 = time.perf_counter(), cpu_s()
        summary = collect(
            tasks,
            PolicyConfig(base_url=url, model="scripted-qwen", version="bench"),
            out,
            desktops=desktops,
            desktop=DesktopConfig(backend="fake", screen_height=height, options={"unique": unique}),
            group=4,
            max_steps=steps,
            image_max=image_max,
            max_inflight=desktops,
        )
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
        storage = storage_report(Path(out))
    n = summary["steps"]
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    window = image_max * (60_000 * 7 // 3)  # a window's images: ~60 KB PNG + its base64 data URL
    per_rollout = (peak_rss - BASELINE_RSS) / desktops - window
    return {
        "bench": "engine_ceiling", "unique_frames": unique, "screen": [1280, height], "desktops": desktops, "steps": n, "wall_s": round(wall, 2),
        "steps_per_s": round(n / wall, 1), "collector_cpu_ms_per_step": round(cpu / n * 1000, 3),
        "model_call_p50_s": summary["model_call_s"]["p50"], "records": summary["records"],
        "peak_rss_mb": round(peak_rss / 2**20, 1),
        "rss_mb_per_inflight_rollout_beyond_window": round(per_rollout / 2**20, 3),
        **storage,
    }  # fmt: skip


def storage_report(run_dir: Path) -> dict:
    """Bytes on disk per step vs storing every request whole (inline data URLs), and the
    overhead over the unique screenshot bytes."""
    from legato_pipelines import read_records
    from legato_pipelines.store.rundir import load_messages

    disk = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    images = sum(p.stat().st_size for p in (run_dir / "images").glob("*.png"))
    steps = [s for r in read_records(run_dir) for s in r["steps"]]
    sample = steps[:: max(1, len(steps) // 200)]  # whole requests measured on <= 200 steps, scaled
    whole = sum(len(orjson.dumps(load_messages(run_dir, s["request"]))) for s in sample) / max(
        1, len(sample)
    )
    return {
        "disk_bytes_per_step": int(disk / len(steps)), "whole_request_bytes_per_step": int(whole),
        "unique_image_bytes": images, "disk_bytes": disk, "overhead_over_images": round(disk / images - 1, 4),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--desktops", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--image-max", type=int, default=20)
    ap.add_argument("--attempts-per-desktop", type=int, default=4)
    ap.add_argument(
        "--height", type=int, default=720, help="screen height (704 is qwen3vl-native: no resize)"
    )
    ap.add_argument(
        "--unique-frames",
        action="store_true",
        help="every screenshot distinct (storage runs; each is resized)",
    )
    args = ap.parse_args()
    script = Path(tempfile.mkdtemp()) / "script.json"
    script.write_text(
        json.dumps({"default": [CLICK]})
    )  # never terminates: every attempt runs --steps steps
    with policy_server_process("--script", str(script)) as url:
        for n in args.desktops:
            print(
                json.dumps(
                    run(
                        url,
                        n,
                        args.steps,
                        args.image_max,
                        args.attempts_per_desktop,
                        args.unique_frames,
                        args.height,
                    )
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
