"""The policy client's overhead per request against a REAL vLLM (issue 31).

    PYTHONPATH=$PWD python3 benchmarks/bench_vllm_client.py [--prompts 24] [--images 2] [--concurrency 4]

Serves the tests' tiny random-weight Qwen3-VL (``tests/vllm_tiny_models.py``) with PyPI's
vLLM CPU build (``scripts/vllm_venv.sh``; prefix caching and the multimodal processor cache
off, so a repeated prompt costs the same each time), then sends the same prompts (``bench_policy.episode_messages``: system
text, ``--images`` screenshots of 448x252 with the model's answers between them) two ways, each
prompt both ways in alternating order, seeded so both generate the same tokens:

  client   ``PolicyClient.complete`` (images as ``legato-image://`` refs spliced in by
           ``encode_body``, answers normalized into a ``PolicyResponse``)
  direct   one ``httpx.AsyncClient.post(json=body)`` with the same fields, images inlined as
           data URLs, the answer parsed with ``resp.json()``

Prints one JSON line per mode (sequential, then ``--concurrency`` in flight, each way twice in
the order client, direct, direct, client): median and p90 seconds per request both ways, the
ratio client/direct of the medians (and of the total wall time when concurrent), the added
milliseconds per request; sequentially also this process's CPU milliseconds per request both
ways (the client's own cost, unaffected by how busy the server's cores are).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_policy import episode_messages  # noqa: E402

from legato_pipelines.images import Screenshot  # noqa: E402
from legato_pipelines.policy import PolicyClient, PolicyConfig  # noqa: E402
from tests.vllm_support import VllmServer, build_model, missing_reason, vllm_python  # noqa: E402

MAX_TOKENS = 16  # [tokens] per request
SEED = 7


def screenshots(n: int, offset: int) -> list[Screenshot]:
    rng = np.random.default_rng(offset)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (252, 448, 3), dtype=np.uint8)).save(
            buf, format="PNG", compress_level=1
        )
        out.append(Screenshot(buf.getvalue(), 448, 252))
    return out


def inlined(messages: list[dict], images: dict[str, Screenshot]) -> list[dict]:
    text = json.dumps(messages)
    for shot in images.values():
        text = text.replace(shot.ref, shot.data_url.decode())
    return json.loads(text)


async def one_client(client: PolicyClient, messages, images) -> tuple[float, float, list[int]]:
    """Wall seconds, this process's CPU seconds, and the token ids of one client call."""
    t0, c0 = time.perf_counter(), time.process_time()
    result = await client.complete(messages, images)
    return time.perf_counter() - t0, time.process_time() - c0, list(result.token_ids or [])


async def one_direct(http: httpx.AsyncClient, url: str, body: dict):
    """The same for one direct httpx request (``json=`` encoding, ``resp.json()``)."""
    t0, c0 = time.perf_counter(), time.process_time()
    resp = await http.post(url, json=body)
    resp.raise_for_status()
    data = resp.json()
    return time.perf_counter() - t0, time.process_time() - c0, data["choices"][0]["token_ids"]


def summary(mode: str, client_s: list[float], direct_s: list[float], walls=None, cpu=None):
    def p90(xs):
        return sorted(xs)[int(0.9 * (len(xs) - 1))]

    med_c, med_d = statistics.median(client_s), statistics.median(direct_s)
    out = {
        "mode": mode,
        "requests_each": len(client_s),
        "client_median_s": round(med_c, 4),
        "client_p90_s": round(p90(client_s), 4),
        "direct_median_s": round(med_d, 4),
        "direct_p90_s": round(p90(direct_s), 4),
        "ratio_median": round(med_c / med_d, 3),
        "added_ms_median": round((med_c - med_d) * 1000, 2),
    }
    if cpu:  # [ms] this process's CPU per request (sequential: only that request in flight)
        out["client_cpu_ms_median"] = round(statistics.median(cpu[0]) * 1000, 2)
        out["direct_cpu_ms_median"] = round(statistics.median(cpu[1]) * 1000, 2)
    if walls:
        out["client_wall_s"], out["direct_wall_s"] = round(walls[0], 3), round(walls[1], 3)
        out["ratio_wall"] = round(walls[0] / walls[1], 3)
    return out


async def run(server: VllmServer, args) -> None:
    prompts = []
    for i in range(args.prompts):
        shots = screenshots(args.images, i)
        prompts.append((episode_messages(shots), {s.sha: s for s in shots}))
    config = PolicyConfig(
        base_url=server.url,
        model=server.model,
        max_tokens=MAX_TOKENS,
        sampling_seed=SEED,
        step_timeout=300,
        retries=0,
    )
    fields = {
        "model": server.model,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": MAX_TOKENS,
        "logprobs": True,
        "top_logprobs": 0,
        "seed": SEED,
        "return_token_ids": True,
    }
    bodies = [{**fields, "messages": inlined(m, imgs)} for m, imgs in prompts]
    url = server.url + "/v1/chat/completions"
    async with (
        PolicyClient(config, max_inflight=args.concurrency) as client,
        httpx.AsyncClient(timeout=300) as http,
    ):
        # warm-up: both paths, one prompt each (connections, vLLM's first multimodal batch)
        await one_client(client, *prompts[0])
        await one_direct(http, url, bodies[0])
        client_s, direct_s, client_cpu, direct_cpu = [], [], [], []
        for i, ((messages, images), body) in enumerate(zip(prompts, bodies, strict=True)):
            pair = [one_client(client, messages, images), one_direct(http, url, body)]
            if i % 2:
                pair.reverse()
            first = await pair[0]
            second = await pair[1]
            (c, c_cpu, c_ids), (d, d_cpu, d_ids) = (second, first) if i % 2 else (first, second)
            assert c_ids == d_ids, "the client and the direct request got different tokens"
            client_s.append(c)
            direct_s.append(d)
            client_cpu.append(c_cpu)
            direct_cpu.append(d_cpu)
        cpu = (client_cpu, direct_cpu)
        print(json.dumps(summary("sequential", client_s, direct_s, cpu=cpu)), flush=True)

        sem = asyncio.Semaphore(args.concurrency)

        async def bounded(coro):
            async with sem:
                return await coro

        walls, per = {"client": 0.0, "direct": 0.0}, {"client": [], "direct": []}
        for kind in ("client", "direct", "direct", "client"):  # ABBA: no order advantage
            t0 = time.perf_counter()
            if kind == "client":
                coros = [one_client(client, m, imgs) for m, imgs in prompts]
            else:
                coros = [one_direct(http, url, b) for b in bodies]
            results = await asyncio.gather(*(bounded(c) for c in coros))
            walls[kind] += time.perf_counter() - t0
            per[kind] += [s for s, _, _ in results]
        print(
            json.dumps(
                summary(
                    f"concurrent_{args.concurrency}",
                    per["client"],
                    per["direct"],
                    (walls["client"], walls["direct"]),
                )
            ),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    if vllm_python() is None:
        raise SystemExit(missing_reason())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on a kill too
    with tempfile.TemporaryDirectory(prefix="legato-bench-vllm-") as tmp:
        root = Path(tmp)
        model = build_model(root / "model")
        # no prefix cache, no multimodal processor cache: the second sending of a prompt costs
        # what the first did
        flags = ("--no-enable-prefix-caching", "--mm-processor-cache-gb", "0")
        server = VllmServer(model, root / "vllm.log", extra_args=flags).start()
        try:
            asyncio.run(run(server, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
