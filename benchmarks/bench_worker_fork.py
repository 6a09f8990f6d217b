"""An osworld worker spawned (and ``preload``-ed) against one forked from a preloaded template.

    PYTHONPATH=$PWD python3 benchmarks/bench_worker_fork.py [--n 5]

Each local desktop's OSWorld grader is an osworld worker; ``preload`` imports desktop_env
(~1.0-1.4 s of CPU on 2 cores). Since issue 18 the graders fork their workers from one
template that imported it once (``desktops/osworld_worker/template.py``). Per side, ``--n`` workers
one after the other, each until it answers ``preload`` and ``plan``: wall time (client side),
the worker's CPU (utime + stime from ``/proc/<pid>/stat``, 10 ms ticks; for a fork it counts
what the template spent on the fork too) and this process's CPU. The template's own start is
printed once. Needs the OSWorld venv (``legato osworld install``).

Each side also runs confined (``confine.py``, as every grader's worker runs since issue 30:
its own pid, mount, IPC and UTS namespaces, the grader user), interleaved with the plain one
(plain, confined, plain, ...); a confined spawned worker's CPU counts its pid-1 child's too.
Needs root for the confined rows. ``forward (pasta)``: connecting a confined forked worker's
network namespace to three host ports (``WorkerProcess.forward``; its worker CPU is not
counted: pasta's is its own process's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import sys
import tempfile
import time

from legato_pipelines.desktops.child_env import SINGLE_THREADED
from legato_pipelines.desktops.osworld_worker import WorkerProcess, osworld_python, worker_env
from legato_pipelines.desktops.osworld_worker.channel import confinement
from legato_pipelines.desktops.osworld_worker.confine import prepare_dir

TICK = os.sysconf("SC_CLK_TCK")
PLAN = {"provider": "local", "vm_url": "http://127.0.0.1:1", "cache_dir": "/tmp/unused"}


def worker_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its children (a confined spawned worker is the child of
    the process the collector spawned)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(c) for c in f.read().split()]
    return worker_cpu_s(pid) + sum(worker_cpu_s(c) for c in children)


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run(python: str, n: int) -> None:
    work = tempfile.mkdtemp(prefix="bench-worker-fork-")

    prepare_dir(work, writable=False)

    def worker(name: str, template: WorkerProcess | None = None, confine=None) -> WorkerProcess:
        os.makedirs(f"{work}/{name}")
        prepare_dir(f"{work}/{name}", writable=False)
        return WorkerProcess(
            python,
            env=worker_env(SINGLE_THREADED, provider="local"),  # a template forks alone
            cwd=f"{work}/{name}",
            name=name,
            log_path=f"{work}/{name}.log",
            template=template,
            confine=confine,
        )

    sides = (("", None), (" confined", confinement()))
    rows: dict[str, list[tuple[float, float, float]]] = {
        f"{kind}{label}": [] for kind in ("spawn + preload", "fork") for label, _ in sides
    }
    for i in range(n):
        for label, confine in sides:
            w = worker(f"spawned{label.strip()}-{i}", confine=confine)
            cpu0, t0 = own_cpu_s(), time.perf_counter()
            await w.start()
            await w.call("preload", 120)
            await w.call("plan", 10, **PLAN)
            rows[f"spawn + preload{label}"].append(
                (time.perf_counter() - t0, tree_cpu_s(w.pid), own_cpu_s() - cpu0)
            )
            await w.stop(5)
    template = worker("template")
    t0 = time.perf_counter()
    await template.start()
    await template.call("preload", 120)
    template_wall, template_cpu = time.perf_counter() - t0, worker_cpu_s(template.pid)
    rows["forward (pasta)"] = []
    service = socket.create_server(("127.0.0.1", 0))
    for i in range(n):
        for label, confine in sides:
            w = worker(f"forked{label.strip()}-{i}", template, confine)
            before, cpu0, t0 = worker_cpu_s(template.pid), own_cpu_s(), time.perf_counter()
            await w.start()
            await w.call("preload", 10)
            await w.call("plan", 10, **PLAN)
            if not w.forked:
                sys.exit("the worker was spawned, not forked: see the warning above")
            cost = worker_cpu_s(w.pid) + worker_cpu_s(template.pid) - before
            rows[f"fork{label}"].append((time.perf_counter() - t0, cost, own_cpu_s() - cpu0))
            if confine is not None:  # its network namespace connected to three host ports
                cpu0, t0 = own_cpu_s(), time.perf_counter()
                await w.forward([service.getsockname()[1], 9222, 8080])
                rows["forward (pasta)"].append((time.perf_counter() - t0, 0.0, own_cpu_s() - cpu0))
            await w.stop(5)
    await template.stop(5)
    service.close()
    for name, measured in rows.items():
        wall, cpu, client = (sorted(c) for c in zip(*measured, strict=True))
        print(
            f"{name:25s} wall median {statistics.median(wall) * 1000:7.1f} ms "
            f"[{wall[0] * 1000:.1f}-{wall[-1] * 1000:.1f}]   worker CPU median "
            f"{statistics.median(cpu) * 1000:5.0f} ms [{cpu[0] * 1000:.0f}-{cpu[-1] * 1000:.0f}]"
            f"   client CPU median {statistics.median(client) * 1000:5.1f} ms"
        )
    print(f"template, once: wall {template_wall * 1000:.0f} ms, CPU {template_cpu * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5, help="workers per side")
    args = parser.parse_args()
    python = osworld_python({})
    if python is None:
        sys.exit("no OSWorld venv (fix: legato osworld install)")
    asyncio.run(run(str(python), args.n))


if __name__ == "__main__":
    main()
