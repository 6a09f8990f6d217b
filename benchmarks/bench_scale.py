"""Scale: many fake desktops with realistic latencies against a loopback scripted policy server.

    python benchmarks/bench_scale.py --desktops 1024 --tasks 256 --group 4

Latencies: model ~2 s median with a long tail (lognormal, sigma 0.6, served by the scripted
server), act 0.1 s, reset 2 s, evaluate 1 s (fake desktops). Reports wall time against the
critical-path bound: for every desktop, the sum over the attempts it ran of the latencies its
fake desktop *sampled* (reset, act, evaluate) plus the model calls' measured seconds; the bound
is the largest such chain. ``wall / bound`` near 1 means the collector adds no delay of its own.

``--oversample-compare`` also runs a heavy-tail batch (act sigma 1.5) with and without
``--oversample 0.25`` and reports the time until every group is closed.
Screens are 640x360 by default so the single-process scripted server on the same 2 cores keeps
up with ~500 requests/s; the engine's own cost at 1280x720 is what bench_engine.py measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CLICK, DONE, policy_server_process  # noqa: E402

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, load_tasks  # noqa: E402
from legato_pipelines.desktops.backends.fake import FakeDesktop, frame_pool  # noqa: E402
from legato_pipelines.store.rundir import read_typed_records  # noqa: E402


class MeteredFakeDesktop(FakeDesktop):
    """A fake desktop that remembers the latencies it sampled (seconds), per desktop."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sampled = 0.0

    async def _sleep(self, phase: str) -> None:
        delay = self.latency[phase].draw(self._rng)
        self.sampled += delay
        if delay > 0:
            await asyncio.sleep(delay)


async def run(
    url: str,
    desktops: int,
    n_tasks: int,
    group: int,
    oversample: float,
    latency: dict,
    size: tuple[int, int],
    max_steps: int,
) -> dict:
    config = DesktopConfig(
        backend="fake",
        screen_width=size[0],
        screen_height=size[1],
        options={"latency": latency, "seed": 1},
    )
    frame_pool(*size, frames=32)
    pool = [MeteredFakeDesktop(config, i) for i in range(desktops)]
    tasks = load_tasks(
        [
            {
                "task_id": f"s{i:05d}",
                "config": {"instruction": f"Scale task {i}", "fake": {"success": 0.5}},
            }
            for i in range(n_tasks)
        ]
    )
    with tempfile.TemporaryDirectory() as out:
        t0 = time.time()
        summary = await collect_async(
            tasks,
            PolicyConfig(base_url=url, model="scripted-qwen", version="scale", step_timeout=120),
            out,
            desktop_pool=pool,
            desktop=config,
            group=group,
            oversample=oversample,
            max_steps=max_steps,
            max_inflight=desktops,
        )
        wall = time.time() - t0
        records = read_typed_records(out)
    model_by_desktop: dict[str, float] = defaultdict(float)
    finished: dict[str, list[float]] = defaultdict(list)
    for r in records:
        model_by_desktop[r.desktop] += sum(s.model.seconds for s in r.steps)
        if r.final:
            finished[r.group_id].append(r.ended_at)
    bound = max(d.sampled + model_by_desktop[d.name] for d in pool)
    close_times = [sorted(ends)[group - 1] - t0 for ends in finished.values() if len(ends) >= group]
    return {
        "bench": "scale",
        "desktops": desktops,
        "tasks": n_tasks,
        "group": group,
        "oversample": oversample,
        "latency": latency,
        "screen": list(size),
        "steps": summary["steps"],
        "records": summary["records"],
        "wall_s": round(wall, 2),
        "critical_path_bound_s": round(bound, 2),
        "wall_over_bound": round(wall / bound, 4),
        "all_groups_closed_s": round(max(close_times), 2) if close_times else None,
        "groups_closed": len(close_times),
        "model_call_s": summary["model_call_s"],
        "missing": summary["missing"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--desktops", type=int, default=1024)
    ap.add_argument("--tasks", type=int, default=256)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=15)
    ap.add_argument(
        "--steps-per-attempt", type=int, default=8, help="scripted: clicks before terminate"
    )
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=360)
    ap.add_argument("--model-median", type=float, default=2.0)
    ap.add_argument("--model-sigma", type=float, default=0.6)
    ap.add_argument("--oversample-compare", action="store_true")
    args = ap.parse_args()
    script = Path(tempfile.mkdtemp()) / "script.json"
    script.write_text(json.dumps({"default": [CLICK] * (args.steps_per_attempt - 1) + [DONE]}))
    size = (args.width, args.height)
    realistic = {"act": 0.1, "reset": 2.0, "evaluate": 1.0}
    with policy_server_process(
        "--script",
        str(script),
        "--latency-median",
        str(args.model_median),
        "--latency-sigma",
        str(args.model_sigma),
    ) as url:
        print(
            json.dumps(
                asyncio.run(
                    run(
                        url,
                        args.desktops,
                        args.tasks,
                        args.group,
                        0.0,
                        realistic,
                        size,
                        args.max_steps,
                    )
                )
            ),
            flush=True,
        )
        if args.oversample_compare:
            heavy = {
                "act": {"dist": "lognormal", "median": 0.1, "sigma": 1.5},
                "reset": 2.0,
                "evaluate": 1.0,
            }
            for over in (0.0, 0.25):
                print(
                    json.dumps(
                        asyncio.run(
                            run(
                                url,
                                args.desktops,
                                args.tasks,
                                args.group,
                                over,
                                heavy,
                                size,
                                args.max_steps,
                            )
                        )
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
