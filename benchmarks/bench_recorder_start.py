"""How long the web recorder takes to start per attempt (``WebRecorder.begin``: the CA copy,
``bwrap``, mitmdump's import, until it listens), on this host's network, no desktop.

    PYTHONPATH=. python benchmarks/bench_recorder_start.py [--n 10]

Run it with ``PYTHONPATH`` at another checkout (``git archive main``) to compare. Needs root,
the web venv (``scripts/web_venv.sh``) and ``bwrap``. Prints the median (min-max) in seconds.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from pathlib import Path

from legato_pipelines.desktops.server.recorder import WebRecorder


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10)
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.n):
            recorder = WebRecorder(
                "record", Path(tmp) / "archive", Path(tmp) / "work", _free_port()
            )
            start = time.monotonic()
            recorder.begin("task", None)
            times.append(time.monotonic() - start)
            recorder.end()
    print(
        f"begin: median {statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f}), n={args.n}"
    )


if __name__ == "__main__":
    main()
