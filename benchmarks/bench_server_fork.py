"""A desktop server spawned against one forked from the preloaded server template.

    PYTHONPATH=$PWD python3 benchmarks/bench_server_fork.py [--n 5] [--no-sandbox]

Each local desktop is a desktop server process; a spawned one imports its modules first
(~0.45 s of CPU: numpy, starlette, uvicorn, Xlib, mss, PIL...). ``ServerProcess(fork=True)``
forks it from a template that imported them once (``desktops/server/template.py``).
Per side, ``--n`` servers at 1280x720 one after the other, each until its READY line: wall
time of ``start()`` (client side), the server process's own CPU just after READY (utime +
stime from ``/proc/<pid>/stat``, 10 ms ticks; for a fork plus what the template spent on the
fork) and this process's CPU. The template's own start (and its stop, EOF to exit) is printed
once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time

from legato_pipelines.desktops.server.desktop import ServerProcess
from legato_pipelines.desktops.server.template import (
    acquire_server_template,
    release_server_template,
)

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run(n: int, sandbox: bool) -> None:
    def server(fork: bool) -> ServerProcess:
        return ServerProcess(width=1280, height=720, sandbox=sandbox, fork=fork)

    rows: dict[str, list[tuple[float, float, float]]] = {"spawn": [], "fork": []}
    for _ in range(n):
        s = server(False)
        cpu0, t0 = own_cpu_s(), time.perf_counter()
        await s.start()
        rows["spawn"].append((time.perf_counter() - t0, cpu_s(s.pid), own_cpu_s() - cpu0))
        await s.stop()
    holder = acquire_server_template()  # the template outlives the forked servers below
    t0 = time.perf_counter()
    if not await holder.ready():
        sys.exit("the server template did not start: see the warning above")
    template_wall, template_cpu = time.perf_counter() - t0, cpu_s(holder.pid)
    try:
        for _ in range(n):
            s = server(True)
            before, cpu0, t0 = cpu_s(holder.pid), own_cpu_s(), time.perf_counter()
            await s.start()
            wall = time.perf_counter() - t0
            if not s.forked:
                sys.exit("the server was spawned, not forked: see the warning above")
            cost = cpu_s(s.pid) + cpu_s(holder.pid) - before
            rows["fork"].append((wall, cost, own_cpu_s() - cpu0))
            await s.stop()
    finally:
        t0 = time.perf_counter()
        await release_server_template(holder)  # the last lease: EOF, the template exits
        template_stop = time.perf_counter() - t0
    for name, measured in rows.items():
        wall, cpu, client = (sorted(c) for c in zip(*measured, strict=True))
        print(
            f"{name:6s} wall median {statistics.median(wall) * 1000:7.1f} ms "
            f"[{wall[0] * 1000:.1f}-{wall[-1] * 1000:.1f}]   server CPU median "
            f"{statistics.median(cpu) * 1000:5.0f} ms [{cpu[0] * 1000:.0f}-{cpu[-1] * 1000:.0f}]"
            f"   client CPU median {statistics.median(client) * 1000:5.1f} ms"
        )
    print(
        f"template, once: wall {template_wall * 1000:.0f} ms, CPU {template_cpu * 1000:.0f} ms,"
        f" stopped in {template_stop * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5, help="servers per side")
    parser.add_argument("--no-sandbox", action="store_true", help="servers without sandbox")
    args = parser.parse_args()
    asyncio.run(run(args.n, not args.no_sandbox))


if __name__ == "__main__":
    main()
