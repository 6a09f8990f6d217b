"""The web recorder's CPU per request, without desktops (issue 34): ``legato-web-recorder``
(confined, as the desktops run it: ``desktops/server/recorder.py``; from an older checkout on
PYTHONPATH, mitmdump as it recorded then) on this host's
network between ``curl`` and the stand-in site, its user + system time (``/proc``) per request.

    PYTHONPATH=. python benchmarks/bench_recorder_cpu.py [--rounds 5] [--requests 100]
        [--site h1|h2] [--json out.json]

Per round: one attempt (``WebRecorder.begin``), ``--requests`` GETs of distinct image URLs by
one ``curl`` through it (one CONNECT tunnel, kept alive: HTTP/1.1, or HTTP/2 with ``--site h2``,
the stand-in served by mitmdump: ``tests/web_standin_h2.py``), the recorder's CPU time over
them (and the wall time of the curl), then the attempt's end (``WebRecorder.end``: the flows
written and moved to the archive; its wall time printed too). Less noisy than the desktops'
step times (``bench_web_recorder.py``) and without Chromium: one connection, requests one
after another, no parallel fetches. Needs root, curl, bubblewrap, the web venv.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.bench_web_recorder import cpu_s
from legato_pipelines.desktops.server.recorder import CA_CERT, WebRecorder, ca_dir
from tests.web_standin import NAME, make_ca, serve_standin, serve_standin_h2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_round(folder: Path, site, ca: Path, requests: int, http2: bool) -> dict:
    """One attempt of ``requests`` GETs: ``{"cpu_ms_per_request", "wall_ms_per_request",
    "end_s"}``."""
    recorder = WebRecorder(
        "record",
        folder / "archive",
        folder / "work",
        _free_port(),
        hosts={NAME: f"127.0.0.1:{site.port}"},
        trusted=[ca],
    )
    urls = [f"https://{NAME}/img/cpu-{i}.png" for i in range(requests)]
    argv = [
        "curl",
        "-s",
        "--fail",
        "-o",
        "/dev/null",
        "--proxy",
        f"http://127.0.0.1:{recorder.port}",
    ]
    argv += ["--cacert", str(ca_dir() / CA_CERT), "--http2" if http2 else "--http1.1", *urls]
    try:
        recorder.begin("cpu", None)
        quiet = {"check": True, "stdout": subprocess.DEVNULL}
        subprocess.run([*argv[:-requests], urls[0]], timeout=60, **quiet)  # mitmdump warm
        used, t0 = cpu_s(recorder.pid), time.perf_counter()
        subprocess.run(argv, timeout=600, **quiet)
        wall, cpu = time.perf_counter() - t0, cpu_s(recorder.pid) - used
        t1 = time.perf_counter()
        recorder.end()
        end_s = time.perf_counter() - t1
    finally:
        recorder.end()
    return {
        "cpu_ms_per_request": cpu * 1000 / requests,
        "wall_ms_per_request": wall * 1000 / requests,
        "end_s": end_s,
    }


def main(rounds: int, requests: int, site_http: str) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="bench-rec-cpu-"))
    ca, cert, key = make_ca(folder / "ca")
    serve = serve_standin_h2 if site_http == "h2" else serve_standin
    with serve(cert, key) as site:
        results = [one_round(folder, site, ca, requests, site_http == "h2") for _ in range(rounds)]
        served = len(site.requests)
    out = {
        key: {
            "median": statistics.median(r[key] for r in results),
            "all": [r[key] for r in results],
        }
        for key in results[0]
    }
    out.update(site=site_http, rounds=rounds, requests=requests, served=served)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--site", choices=("h1", "h2"), default="h1")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = main(args.rounds, args.requests, args.site)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    for key in ("cpu_ms_per_request", "wall_ms_per_request", "end_s"):
        values = ", ".join(f"{v:.2f}" for v in result[key]["all"])
        print(f"{key:20s} median {result[key]['median']:.2f} ({values})")
    print(f"site {result['site']}, {result['requests']} requests x {result['rounds']} rounds")
