"""``legato view`` on a 1,000-rollout batch: how long the index takes, and the whole report.

    python benchmarks/bench_view.py [--rollouts 1000] [--steps 4] [--screens 200]

A synthetic run directory in format ``legato.rollout/v0`` (250 tasks x 4 attempts, 4 steps
each: a click, typing, a key, terminate; real 1280x704 PNG screenshots drawn with Pillow, a
pool of ``--screens`` distinct ones), then ``legato view RUN_DIR`` as a user runs it (a new
process), twice: cold (thumbnails made) and warm (thumbnails kept).

Goal (issue 17): the index of a 1,000-rollout batch in under 5 s.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from PIL import Image, ImageDraw


def _screens(root: Path, n: int, rng: random.Random) -> list[str]:
    (root / "images").mkdir(parents=True, exist_ok=True)
    shas = []
    for i in range(n):
        im = Image.new("RGB", (1280, 704), (20, 20, 20))
        draw = ImageDraw.Draw(im)
        x0, y0 = rng.randrange(0, 500), rng.randrange(0, 250)
        draw.rectangle((x0, y0, x0 + 700, y0 + 420), fill=(250, 250, 250), outline=(90, 120, 200))
        draw.rectangle((x0, y0, x0 + 700, y0 + 20), fill=(110, 150, 210))
        for line in range(rng.randrange(3, 18)):
            draw.text(
                (x0 + 6, y0 + 28 + 16 * line), f"user@vm:~$ command {i}.{line}", fill=(0, 0, 0)
            )
        buffer = io.BytesIO()
        im.save(buffer, format="PNG")
        data = buffer.getvalue()
        sha = hashlib.sha256(data).hexdigest()
        (root / "images" / f"{sha}.png").write_bytes(data)
        shas.append(sha)
    return shas


def write_batch(root: Path, rollouts: int, steps: int, screens: int, seed: int = 0) -> None:
    """A run directory of ``rollouts`` executions (groups of 4) with ``steps`` steps each."""
    rng = random.Random(seed)
    pool = _screens(root, screens, rng)
    (root / "messages").mkdir(exist_ok=True)
    policy = {"model": "scripted-qwen", "version": "step-1000"}
    (root / "run.json").write_bytes(
        orjson.dumps(
            {
                "format": "legato.rollout/v0",
                "policy": policy,
                "task_set": "bench",
                "tasks_path": "tasks.json",
                "knobs": {"group": 4, "harness": "qwen3vl", "backend": "local"},
                "created_at": time.time(),
            }
        )
    )
    lines = []
    for n in range(rollouts):
        task = f"task-{n // 4:03d}"
        step_list = []
        for k in range(steps):
            kind = ("left_click", "type", "key", "terminate")[min(k, 3)]
            action: dict = {"action": kind, "arguments": {"action": kind}}
            if kind == "left_click":
                action["screen"] = [rng.randrange(1280), rng.randrange(720)]
            elif kind == "type":
                action["text"] = "ls -la\n"
            elif kind == "key":
                action["keys"] = ["ctrl", "s"]
            else:
                action["status"] = "success"
            action.update(act_s=0.01, wait_s=0.2, ready_s=0.18)
            tokens = rng.randrange(30, 120)
            step_list.append(
                {
                    "step": k,
                    "request": [],
                    "response": {
                        "content": f"Action: {kind}.\n<tool_call>...</tool_call>",
                        "reasoning": None,
                        "token_ids": list(range(tokens)),
                        "logprobs": [-0.5] * tokens,
                        "tokens": None,
                        "finish_reason": "stop",
                    },
                    "model": {"prompt_tokens": 1500, "completion_tokens": tokens, "cached_tokens": 1400,
                              "seconds": 0.4, "attempts": 1, "timeouts": 0,
                              "token_ids_source": "token_ids", "notes": []},
                    "action_text": f"{kind}",
                    "parse_error": None,
                    "actions": [action],
                    "obs_s": 0.02,
                    "observation": rng.choice(pool),
                }
            )  # fmt: skip
        reward = float(rng.random() < 0.5)
        lines.append(
            orjson.dumps(
                {
                    "format": "legato.rollout/v0",
                    "rollout_id": hashlib.md5(f"r{n}".encode()).hexdigest(),
                    "task_id": task,
                    "domain": "terminal",
                    "group_id": task,
                    "attempt": n % 4,
                    "execution": 0,
                    "policy": policy,
                    "task_set": "bench",
                    "status": "ok",
                    "outcome": "done",
                    "reward": reward,
                    "error": None,
                    "eval_error": None,
                    "n_steps": steps,
                    "desktop": f"local-{n % 16}",
                    "started_at": 1.7e9 + n,
                    "ended_at": 1.7e9 + n + 20,
                    "timing": {
                        "queue_s": 0.0,
                        "reset_s": 1.0,
                        "policy_s": 1.6,
                        "act_s": 0.04,
                        "wait_s": 0.8,
                        "obs_s": 0.08,
                        "eval_s": 0.3,
                        "total_s": 3.9,
                    },
                    "reset": {"kind": "fast", "ready_s": 0.2, "wait_s": 0.2},
                    "steps": step_list,
                }
            )  # fmt: skip
        )
    (root / "rollouts.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def _view(run: Path) -> dict:
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "view", str(run)], capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(res.stderr)
    match = re.search(r"index ([\d.]+) s, all pages ([\d.]+) s", res.stdout)
    return {
        "command_wall_s": round(wall, 2),
        "index_s": float(match.group(1)),
        "all_pages_s": float(match.group(2)),
    }


def main() -> None:
    """Write the batch, run ``legato view`` on it cold and warm, print one JSON line."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--screens", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        t0 = time.perf_counter()
        write_batch(run, args.rollouts, args.steps, args.screens)
        setup = time.perf_counter() - t0
        cold = _view(run)
        warm = _view(run)
        report = run / "report"
        size = {
            "index_kb": round((report / "index.html").stat().st_size / 1024),
            "rollout_pages": len(list((report / "rollouts").iterdir())),
            "group_pages": len(list((report / "groups").iterdir())),
            "thumbs": len(list((report / "thumbs").iterdir())),
            "thumb_kb_mean": round(
                sum(p.stat().st_size for p in (report / "thumbs").iterdir())
                / 1024
                / max(1, len(list((report / "thumbs").iterdir()))),
                1,
            ),
        }
    print(
        json.dumps(
            {
                "bench": "view",
                "rollouts": args.rollouts,
                "steps": args.steps,
                "screens": args.screens,
                "setup_s": round(setup, 1),
                "cold": cold,
                "warm": warm,
                **size,
            }
        )
    )


if __name__ == "__main__":
    main()
