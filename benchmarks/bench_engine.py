"""Engine ceiling: how many policy steps per second one collector process drives, and how much
collector CPU each step costs, with zero-latency fake desktops (1280x720 PNG screenshots), a
loopback scripted policy server (vLLM wire format, in its own process) and image_max 20.

    python benchmarks/bench_engine.py --desktops 64 1024 --steps 15

Goal (issue 2): <= 3 ms of collector CPU per step. Prints one JSON line per run.

Storage of prompt ids (issue 13): ``--image-tokens 880`` makes the server's prompt ids as long
as Qwen3-VL's for 1280x704 screenshots (880 ``<|image_pad|>`` ids each); the storage report
then gives the bytes per step of ``rollouts.jsonl`` and of the ``samples`` Parquet with the
prompt ids and without them (the same records with ``prompt_ids`` dropped: byte for byte what
the writer wrote before it stored them; the samples without ``prompt_token_ids``).
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
from legato_pipelines.desktops.backends.fake import frame_pool  # noqa: E402

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
        storage |= prompt_ids_report(Path(out))
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


def prompt_ids_report(run_dir: Path) -> dict:
    """Bytes per step that storing the server's prompt ids costs: ``rollouts.jsonl`` with and
    without the steps' ``prompt_ids`` (the key is written only when set, so the lines without
    it are what the writer wrote before), and the ``samples`` Parquet (pyarrow defaults:
    dictionary + RLE, snappy) with and without ``prompt_token_ids``; and the raw size of the
    prompt ids (int64 each, what storing every step's prompt whole would hold)."""
    import io

    import pyarrow.parquet as pq

    from legato_pipelines import export_steps

    lines = (run_dir / "rollouts.jsonl").read_bytes().splitlines()
    without = 0
    n_steps = 0
    for line in lines:
        record = orjson.loads(line)
        for step in record["steps"]:
            step.pop("prompt_ids", None)
            n_steps += 1
        without += len(orjson.dumps(record)) + 1
    with_ids = sum(len(line) + 1 for line in lines)
    table = export_steps(run_dir)

    def parquet_bytes(t) -> int:
        buf = io.BytesIO()
        pq.write_table(t, buf)
        return buf.tell()

    samples = parquet_bytes(table)
    samples_without = parquet_bytes(table.drop_columns(["prompt_token_ids"]))
    ids = table.column("prompt_token_ids").to_pylist()
    raw = sum(8 * len(v) for v in ids if v)
    n = max(1, n_steps)
    rows = max(1, table.num_rows)
    return {
        "records_bytes_per_step": round(with_ids / n), "records_bytes_per_step_without_prompt_ids": round(without / n),
        "samples_parquet_bytes_per_step": round(samples / rows), "samples_parquet_bytes_per_step_without_prompt_ids": round(samples_without / rows),
        "prompt_ids_raw_int64_bytes_per_step": round(raw / rows),
        "prompt_tokens_mean": round(sum(len(v) for v in ids if v) / rows),
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
    ap.add_argument(
        "--image-tokens",
        type=int,
        default=64,
        help="the scripted server's prompt tokens per image (Qwen3-VL at 1280x704: 880)",
    )
    args = ap.parse_args()
    script = Path(tempfile.mkdtemp()) / "script.json"
    script.write_text(
        json.dumps({"default": [CLICK]})
    )  # never terminates: every attempt runs --steps steps
    server_args = ("--script", str(script), "--image-tokens", str(args.image_tokens))
    with policy_server_process(*server_args) as url:
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
