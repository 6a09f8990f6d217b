"""Policy client and scripted server costs.

    python benchmarks/bench_policy.py [--images 20] [--image-kb 60] [--calls 2000] [--concurrency 64]

Measures (one JSON line each):
  encode_body      client CPU to build one request body with N images of ~K KB spliced in
                   (the engine's budget is <= 3 ms CPU per step in total)
  normalize        client CPU to normalize one vLLM answer (~60 tokens with ids and logprobs)
  client_loop      end to end against ``legato scripted-policy`` in its own process (vLLM wire
                   format, loopback): calls/s, client CPU per call, server CPU per call
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import free_port  # noqa: E402

from legato_pipelines.images import Screenshot  # noqa: E402
from legato_pipelines.policy import PolicyClient, PolicyConfig  # noqa: E402
from legato_pipelines.policy.wire import encode_body, normalize  # noqa: E402


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def screenshots(n: int, kb: int) -> list[Screenshot]:
    side = int((kb * 1024 / 3) ** 0.5)
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(
            buf, format="PNG", compress_level=1
        )
        out.append(Screenshot(buf.getvalue(), side, side))
    return out


def episode_messages(shots: list[Screenshot]) -> list[dict]:
    """A Qwen-style prompt: system text, then per step a screenshot and the model's answer."""
    answer = 'Action: Click OK.\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 400]}}\n</tool_call>'
    messages: list[dict] = [{"role": "system", "content": "You are a computer-use agent. " * 80}]
    for i, shot in enumerate(shots):
        parts = [
            {"type": "text", "text": f"Step {i}: the screen now."},
            {"type": "image_url", "image_url": {"url": shot.ref}},
        ]
        messages.append({"role": "user", "content": parts})
        if i < len(shots) - 1:
            messages.append({"role": "assistant", "content": answer})
    return messages


def bench_encode(shots: list[Screenshot], reps: int) -> dict:
    images = {s.sha: s for s in shots}
    for s in shots:
        s.data_url  # noqa: B018 - cached once per screenshot, as in the engine
    messages = episode_messages(shots)
    fields = {
        "model": "m",
        "temperature": 1.0,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }
    c0 = time.process_time()
    for _ in range(reps):
        body = encode_body({**fields, "messages": messages}, images)
    per = (time.process_time() - c0) / reps
    return {
        "bench": "encode_body",
        "images": len(shots),
        "body_bytes": len(body),
        "cpu_ms_per_call": round(per * 1000, 3),
    }


def bench_normalize(reps: int) -> dict:
    n = 60
    payload = orjson.dumps(
        {
            "choices": [
                {
                    "message": {"role": "assistant", "content": "x" * n, "reasoning": None},
                    "logprobs": {
                        "content": [
                            {"token": "x", "logprob": -0.1, "bytes": [120], "top_logprobs": []}
                        ]
                        * n
                    },
                    "token_ids": list(range(n)),
                    "finish_reason": "stop",
                }
            ],
            "prompt_token_ids": list(range(3000)),
            "usage": {
                "prompt_tokens": 3000,
                "completion_tokens": n,
                "prompt_tokens_details": {"cached_tokens": 2900},
            },
        }
    )
    c0 = time.process_time()
    for _ in range(reps):
        normalize(orjson.loads(payload), asked_ids=True)
    per = (time.process_time() - c0) / reps
    return {
        "bench": "normalize",
        "tokens": n,
        "prompt_ids": 3000,
        "cpu_ms_per_call": round(per * 1000, 3),
    }


async def client_loop(
    url: str, shots: list[Screenshot], calls: int, concurrency: int
) -> tuple[int, float]:
    images = {s.sha: s for s in shots}
    cfg = PolicyConfig(base_url=url, model="scripted-qwen", step_timeout=30)
    done = 0
    async with PolicyClient(cfg, max_inflight=concurrency) as client:

        async def worker(w: int) -> None:
            nonlocal done
            while done < calls:
                done += 1
                # each worker has its own episode so prompts differ like concurrent rollouts
                messages = episode_messages(shots)
                messages[1]["content"][0]["text"] = f"worker {w} call {done}"
                await client.complete(messages, images)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return done, time.perf_counter() - t0


def bench_client(shots: list[Screenshot], calls: int, concurrency: int) -> dict:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "legato_pipelines", "scripted-policy", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        asyncio.run(client_loop(url, shots, 50, 4))  # warm up
        c0, s0 = cpu_s(), proc_cpu_s(proc.pid)
        n, wall = asyncio.run(client_loop(url, shots, calls, concurrency))
        client_cpu, server_cpu = cpu_s() - c0, proc_cpu_s(proc.pid) - s0
    finally:
        proc.terminate()
        proc.wait(10)
    return {
        "bench": "client_loop",
        "images": len(shots),
        "calls": n,
        "concurrency": concurrency,
        "calls_per_s": round(n / wall, 1),
        "client_cpu_ms_per_call": round(client_cpu / n * 1000, 3),
        "server_cpu_ms_per_call": round(server_cpu / n * 1000, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--image-kb", type=int, default=60)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    shots = screenshots(args.images, args.image_kb)
    print(json.dumps(bench_encode(shots, 500)), flush=True)
    print(json.dumps(bench_normalize(5000)), flush=True)
    print(json.dumps(bench_client(shots, args.calls, args.concurrency)), flush=True)
    small = screenshots(1, 4)
    print(json.dumps(bench_client(small, args.calls, args.concurrency)), flush=True)


if __name__ == "__main__":
    main()
