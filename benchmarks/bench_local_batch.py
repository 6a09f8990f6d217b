"""A batch of the local task suite on real Xvfb desktops, one collection per mode, same tasks,
same machine, with the correct scripts of the scripted policy server.

    python benchmarks/bench_local_batch.py --desktops 2                     # issue 6
    python benchmarks/bench_local_batch.py --desktops 2 --compare spares   # issue 18
    python benchmarks/bench_local_batch.py --desktops 2 --compare before --before /tmp/old

``--compare osworld`` (default; issue 6): the defaults against the OSWorld-style settings
(``--no-ready-signal --fixed-wait 5 --no-fast-reset``); goal: wall-time ratio <= 0.4 at the
same success rate.

``--compare spares`` (issue 18, reset off the critical path): ``--spares 0`` (a desktop is
reset when its runner asks for it, as before) against ``--spares <desktops>`` (a spare per
runner, reset and set up for the next queued attempt while the policy drives the current
one), paired runs in alternating order (``--repeats``). Per mode: wall time, the reset on the
critical path per app (the profile's ``reset_critical``: median, p90, share prepared ahead),
the desktops' memory (peak and mean PSS of every process under ``legato collect`` but itself,
sampled every 0.5 s: the desktop servers, Xvfb, the apps) and the CPU seconds of the whole
process tree (``RUSAGE_CHILDREN``). Goal: reset on the critical path <= 0.2 s median per app,
wall time <= 0.6x. ``--latency`` adds seconds per model call (0: the scripted server answers
at once, so only actions, waits and grading hide a reset). ``--tasks``/``--script`` run
another task list (e.g. OSWorld tasks that run locally) with its own script.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from legato_pipelines.policy.scripted import Latency, ScriptedPolicyServer

SUITE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "local"
COMPARE = {
    "osworld": {
        "defaults": [],
        "osworld_style": ["--no-ready-signal", "--fixed-wait", "5", "--no-fast-reset"],
    },
    # the first mode's wall over the second's is the figure (goal: <= 0.6)
    "spares": {"spares_on": ["--spares", "{spares}"], "spares_off": ["--spares", "0"]},
    # this tree's defaults against another checkout's (``--before DIR``: e.g. a `git archive`
    # of the commit before issue 18), each with its own defaults
    "before": {"now": [], "before": []},
}


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (from /proc's parent links), not ``pid`` itself."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def pss_mb(pids: list[int]) -> float:
    """Summed proportional set size of ``pids`` in MB (shared pages split between sharers)."""
    total_kb = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total_kb += int(line.split()[1])
                        break
        except OSError:
            continue
    return total_kb / 1024


def timeline(run_dir: Path, launched: float, exited: float, runners: int) -> dict:
    """Where one batch's wall time went, from its records (Unix seconds ``launched`` /
    ``exited``: the ``legato collect`` process's start and end; ``runners``: attempts at once).

    ``startup_s``: launch to the batch's start (imports, policy check, run directory, the
    desktops the batch waits for; the start is the earliest ``started_at``, when the first
    preparation began); ``runner_s``: per app, the runners' seconds summed over its attempts:
    ``reset_critical`` (waiting for a ready desktop) and the attempt's own phases (``policy``,
    ``act``, ``wait``, ``obs``, ``eval``); ``idle_s``: the rest of ``runners x`` (last record's
    end - batch start): bookkeeping between phases and runners idle at the end (``imbalance_s``:
    the last record's end minus the one before); ``exit_s``: the last record to the process's
    end (summary, closing desktops)."""
    records = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    start = min(r["started_at"] for r in records)
    phases = ("reset_critical", "policy", "act", "wait", "obs", "eval")
    per_app: dict[str, dict[str, float]] = {}
    for r in records:
        app = per_app.setdefault(r.get("domain") or "-", dict.fromkeys(("n", *phases), 0.0))
        app["n"] += 1
        for phase in phases:
            app[phase] += r["timing"].get(f"{phase}_s", 0.0)
    ends = sorted(r["ended_at"] for r in records)
    used = sum(sum(p[k] for k in phases) for p in per_app.values())
    return {
        "startup_s": round(start - launched, 2),
        "runner_s": {app: {k: round(v, 2) for k, v in p.items()} for app, p in per_app.items()},
        "idle_s": round(runners * (ends[-1] - start) - used, 2),
        "imbalance_s": round(ends[-1] - ends[-2], 2) if len(ends) > 1 else 0.0,
        "exit_s": round(exited - ends[-1], 2),
    }


def run_mode(cmd: list[str], cwd: Path | None = None) -> tuple[dict, float, dict]:
    """Run one collection (in ``cwd``: ``python -m`` imports the package found there first);
    return its summary, wall seconds and resource figures."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    samples: list[float] = []
    t0, launched = time.perf_counter(), time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            samples.append(pss_mb(descendants(proc.pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall, exited = time.perf_counter() - t0, time.time()
    stop.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(err)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    used = [s for s in samples if s > 0]
    return (
        json.loads(out),
        wall,
        {
            "desktops_pss_peak_mb": round(max(used), 1) if used else None,
            "desktops_pss_mean_mb": round(statistics.fmean(used), 1) if used else None,
            "cpu_s": round(cpu, 1),
            "timeline": timeline(
                Path(cmd[cmd.index("--out") + 1]),
                launched,
                exited,
                int(cmd[cmd.index("--desktops") + 1]),
            ),
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--desktops", type=int, default=2)
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument("--compare", choices=sorted(COMPARE), default="osworld")
    ap.add_argument("--spares", type=int, help="spare desktops of spares_on (default: --desktops)")
    ap.add_argument("--repeats", type=int, default=1, help="paired runs, alternating order")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds per model call")
    ap.add_argument("--tasks", type=Path, default=SUITE / "tasks.json")
    ap.add_argument("--script", type=Path, default=SUITE / "scripts" / "correct.json")
    ap.add_argument("--osworld", type=Path, help="directory of OSWorld task configs")
    ap.add_argument("--before", type=Path, help="--compare before: the other checkout")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        help="file cache of the download steps (desktop option cache_dir), e.g. one holding"
        " benchmarks/thunderbird_standin.py's profile tarball",
    )
    args = ap.parse_args()
    if args.compare == "before" and not (
        args.before and (args.before / "legato_pipelines").is_dir()
    ):
        ap.error("--compare before needs --before DIR, a checkout holding legato_pipelines/")
    # Both sides from compiled bytecode: with PYTHONDONTWRITEBYTECODE set (as on the machine
    # this was measured on) a fresh checkout would compile its sources at every start, in the
    # collector and in every desktop server, which is not what a user's install does.
    for tree in (Path(__file__).resolve().parents[1], args.before):
        if tree is not None:
            compileall.compile_dir(tree / "legato_pipelines", quiet=1)
    modes = {
        name: [flag.format(spares=args.spares or args.desktops) for flag in flags]
        for name, flags in COMPARE[args.compare].items()
    }
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    with ScriptedPolicyServer(
        flavor="vllm", script=args.script, latency=Latency(args.latency)
    ) as server:
        for repeat in range(args.repeats):
            order = list(modes) if repeat % 2 == 0 else list(reversed(modes))
            for mode in order:
                out = Path(tempfile.mkdtemp()) / "run"
                cmd = [
                    sys.executable,
                    "-m",
                    "legato_pipelines",
                    "collect",
                    "--backend",
                    "local",
                    "--tasks",
                    str(args.tasks),
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
                    *(["--osworld", str(args.osworld)] if args.osworld else []),
                    *(
                        ["--desktop-option", f"cache_dir={args.cache_dir.resolve()}"]
                        if args.cache_dir
                        else []
                    ),
                    *modes[mode],
                ]
                # ``python -m`` in the other checkout imports its package (and its desktop
                # servers run from it)
                s, wall, cost = run_mode(cmd, args.before.resolve() if mode == "before" else None)
                row = {
                    "wall_s": round(wall, 1),
                    "success_rate": s["success_rate"],
                    "counts": {k: v for k, v in s["counts"].items() if v},
                    "time_share": {k: round(v, 3) for k, v in s["time_share"].items()},
                }
                if "reset_critical" in s:
                    critical = s["reset_critical"]
                    row["reset_critical"] = {
                        name: {k: c[k] for k in ("n", "p50", "p90", "ahead")}
                        for name, c in {"all": critical["overall"], **critical["by_domain"]}.items()
                    }
                    row["knobs"] = {k: s["knobs"][k] for k in ("desktops", "spares")}
                row.update(cost)
                results[mode].append(row)
                print(json.dumps({"bench": "local_batch", "mode": mode, **row}), flush=True)
    first, second = (statistics.median(r["wall_s"] for r in results[m]) for m in modes)
    print(json.dumps({"bench": "local_batch", "wall_ratio": round(first / second, 3)}))


if __name__ == "__main__":
    main()
