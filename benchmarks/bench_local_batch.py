"""A batch of the local task suite on real Xvfb desktops, defaults vs the OSWorld-style
settings (``--no-ready-signal --fixed-wait 5 --no-fast-reset``), same tasks, same machine,
with the correct scripts of the scripted policy server.

    python benchmarks/bench_local_batch.py --desktops 2

Goal (issue 6): wall-time ratio <= 0.4 at the same success rate.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from legato_pipelines.policy.scripted import ScriptedPolicyServer

SUITE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "local"
MODES = {
    "defaults": [],
    "osworld_style": ["--no-ready-signal", "--fixed-wait", "5", "--no-fast-reset"],
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--desktops", type=int, default=2)
    ap.add_argument("--group", type=int, default=1)
    args = ap.parse_args()
    results = {}
    with ScriptedPolicyServer(flavor="vllm", script=SUITE / "scripts" / "correct.json") as server:
        for mode, flags in MODES.items():
            out = Path(tempfile.mkdtemp()) / "run"
            t0 = time.perf_counter()
            res = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "legato_pipelines",
                    "collect",
                    "--backend",
                    "local",
                    "--tasks",
                    str(SUITE / "tasks.json"),
                    "--policy-url",
                    server.url,
                    "--model",
                    server.model,
                    "--out",
                    str(out),
                    "--desktops",
                    str(args.desktops),
                    "--group",
                    str(args.group),
                    "--json",
                    *flags,
                ],
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - t0
            if res.returncode:
                raise SystemExit(res.stderr)
            s = json.loads(res.stdout)
            results[mode] = {
                "wall_s": round(wall, 1),
                "success_rate": s["success_rate"],
                "counts": {k: v for k, v in s["counts"].items() if v},
                "time_share": {k: round(v, 3) for k, v in s["time_share"].items()},
            }
            print(json.dumps({"bench": "local_batch", "mode": mode, **results[mode]}), flush=True)
    print(
        json.dumps(
            {
                "bench": "local_batch",
                "wall_ratio": round(
                    results["defaults"]["wall_s"] / results["osworld_style"]["wall_s"], 3
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
