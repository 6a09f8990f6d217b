"""Synthetic run directories in format ``legato.rollout/v0`` for lake and Dagster tests.

Written file by file from the format in docs/architecture.md §7 (not by the engine), so the
lake can be tested on its own: a group of attempts per task, one retried execution, one policy
error.
"""

from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path

import orjson

PHASES = ("queue", "reset", "policy", "act", "wait", "obs", "eval")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_run_dir(
    root: Path,
    *,
    version: str = "step-1",
    model: str = "scripted",
    task_set: str = "0123456789abcdef",
    tasks: tuple[str, ...] = ("fake-001", "fake-002"),
    group: int = 3,
    steps: int = 2,
    seed: int = 0,
    logprobs: bool = True,
) -> dict:
    """Write a run directory and return ``{"records": [...], "summary": {...}}``.

    Per task: ``group`` attempts with status ``ok`` and rewards drawn 0/1; the first attempt
    of the first task is preceded by a ``retried`` execution; the last attempt of the last
    task ends with a policy ``error``.
    """
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "messages").mkdir(exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    policy = {"model": model, "version": version}
    run = {
        "format": "legato.rollout/v0",
        "policy": policy,
        "task_set": task_set,
        "tasks_path": "tasks.json",
        "created_at": time.time(),
    }
    (root / "run.json").write_bytes(orjson.dumps(run))
    image = b"\x89PNG fake " + version.encode()
    image_sha = _sha(image)
    (root / "images" / f"{image_sha}.png").write_bytes(image)
    records = []
    t0 = 1_700_000_000.0
    for ti, task_id in enumerate(tasks):
        group_id = f"{task_id}:{version}"
        for attempt in range(group):
            executions = ["retried", "ok"] if (ti == 0 and attempt == 0) else ["ok"]
            if ti == len(tasks) - 1 and attempt == group - 1:
                executions = ["error"]
            for execution, status in enumerate(executions):
                step_list = []
                n = steps if status != "retried" else 1
                for k in range(n):
                    message = {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": f"{task_id} {k}"},
                            {
                                "type": "image_url",
                                "image_url": {"url": f"legato-image://{image_sha}"},
                            },
                        ],
                    }
                    data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
                    msha = _sha(data)
                    (root / "messages" / f"{msha}.json").write_bytes(data)
                    step_list.append(
                        {
                            "step": k,
                            "request": [msha],
                            "response": {
                                "content": f"click {k}",
                                "reasoning": None,
                                "token_ids": [1, 2, 3] if logprobs else None,
                                "logprobs": [-0.1, -0.2, -0.3] if logprobs else None,
                                "tokens": ["a", "b", "c"] if logprobs else None,
                                "finish_reason": "stop",
                            },
                            "model": {
                                "prompt_tokens": 100,
                                "completion_tokens": 3,
                                "cached_tokens": 80,
                                "seconds": 0.05,
                                "attempts": 1,
                                "timeouts": 0,
                                "token_ids_source": "return_token_ids",
                                "notes": [],
                            },
                            "action_text": f"click({k},{k})",
                            "parse_error": None,
                            "actions": [
                                {
                                    "action": "click",
                                    "arguments": {"x": k, "y": k},
                                    "screen": [k, k],
                                    "act_s": 0.01,
                                    "wait_s": 0.2,
                                    "ready_s": 0.15,
                                }
                            ],
                            "obs_s": 0.02,
                            "observation": image_sha,
                        }
                    )
                reward = float(rng.random() < 0.5) if status == "ok" else None
                timing = {f"{p}_s": round(rng.uniform(0.01, 1.0), 3) for p in PHASES}
                timing["total_s"] = round(sum(timing.values()), 3)
                records.append(
                    {
                        "format": "legato.rollout/v0",
                        "rollout_id": _sha(f"{version}{task_id}{attempt}{execution}".encode())[:32],
                        "task_id": task_id,
                        "domain": None,
                        "group_id": group_id,
                        "attempt": attempt,
                        "execution": execution,
                        "policy": policy,
                        "task_set": task_set,
                        "status": status,
                        "outcome": "done" if status == "ok" else None,
                        "reward": reward,
                        "error": {
                            "kind": "policy",
                            "type": "PolicyTimeout",
                            "message": "deadline",
                            "phase": "policy",
                        }
                        if status == "error"
                        else (
                            {
                                "kind": "env",
                                "type": "DesktopError",
                                "message": "crash",
                                "phase": "act",
                            }
                            if status == "retried"
                            else None
                        ),
                        "eval_error": None,
                        "n_steps": len(step_list),
                        "desktop": f"fake-{attempt % 2}",
                        "started_at": t0 + len(records),
                        "ended_at": t0 + len(records) + timing["total_s"],
                        "timing": timing,
                        "reset": {"kind": "fast", "ready_s": 0.1},
                        "steps": step_list,
                    }
                )
    with open(root / "rollouts.jsonl", "wb") as fh:
        for r in records:
            fh.write(orjson.dumps(r) + b"\n")
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    final = [r for r in records if r["status"] == "ok"]
    totals = {p: sum(r["timing"][f"{p}_s"] for r in records) for p in PHASES}
    whole = sum(totals.values())
    summary = {
        "format": "legato.rollout/v0",
        "policy": policy,
        "task_set": task_set,
        "tasks_path": "tasks.json",
        "knobs": {"group": group, "oversample": 0.0, "max_steps": steps},
        "counts": counts,
        "scheduled": len(tasks) * group,
        "retries": counts.get("retried", 0),
        "records": len(records),
        "groups": {"total": len(tasks), "closed": len(tasks)},
        "success_rate": sum(r["reward"] for r in final) / len(final),
        "rollouts_per_hour": 1234.5,
        "wall_s": 10.0,
        "time_share": {p: totals[p] / whole for p in PHASES},
        "model_call_s": {"p50": 0.05, "p95": 0.05, "p99": 0.05},
        "retried_calls": 0,
        "hung_calls": 0,
        "policy_errors": 1,
        "env_errors": 0,
        "prefix_cache_hit_rate": 0.8,
        "logprobs_share": 1.0 if logprobs else 0.0,
        "token_ids_share": 1.0 if logprobs else 0.0,
    }
    (root / "summary.json").write_bytes(orjson.dumps(summary))
    return {"records": records, "summary": summary}
