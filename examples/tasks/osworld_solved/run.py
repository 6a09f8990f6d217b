"""Run the oracle suite: every solved OSWorld task with its script, then with a do-nothing policy.

    python examples/tasks/osworld_solved/run.py                        # local desktops
    python examples/tasks/osworld_solved/run.py --backend osworld --osworld-provider local
    python examples/tasks/osworld_solved/run.py --only gimp --only 0e763496   # a subset

Each pass is one ``legato collect`` batch (one attempt per task, ``--desktops`` at once) answered
by a scripted policy server on loopback: ``scripts/solve.json`` for the solved pass, a
``terminate`` at once for every task in the do-nothing pass. The files the tasks download and
the gold files they compare against are built by ``files.py`` into a fresh file cache, laid out
for both backends (``<cache>/<task_id>/`` as the local backend reads it, and every desktop's
``<cache>/desktop-<i>/<task_id>/`` as the osworld backend's DesktopEnv caches read it).

Prints one row per task (reward solved, reward doing nothing, the record's status and error
when not ``ok``) and the wall time of each pass. Exit status 0 only when every task scores 1
solved and 0 doing nothing; 1 otherwise; 2 on a bad argument. Arguments after ``--`` go to
``legato collect`` unchanged (e.g. ``-- --desktop-option ready_app_window_s=60``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from legato_pipelines import read_records
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.policy.synthetic import qwen_response
from legato_pipelines.tasks import load_tasks

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
OSWORLD = REPO / "tests" / "data" / "osworld"

#: The do-nothing policy: every task's first answer ends the attempt as done.
NOTHING = {"default": [qwen_response("Done.", {"action": "terminate", "status": "success"})]}


def _files():
    """``files.py`` (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("osworld_solved_files", HERE / "files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def select(entries: list[dict], only: list[str]) -> list[dict]:
    """The task list entries whose domain or task id prefix is in ``only`` (all when empty).

    Raises ``SystemExit`` (status 2) naming a selector that matches no task."""
    if not only:
        return entries
    for selector in only:
        if not any(e["domain"] == selector or e["task_id"].startswith(selector) for e in entries):
            raise SystemExit(f"--only {selector!r}: no task has that domain or id prefix")
    return [e for e in entries if any(e["domain"] == s or e["task_id"].startswith(s) for s in only)]


def fill(cache: Path, tasks, desktops: int) -> None:
    """Build the tasks' files into ``cache`` for both backends' layouts (module doc)."""
    fill_cache = _files().fill_cache
    fill_cache(cache, tasks)
    for i in range(desktops):
        fill_cache(cache / f"desktop-{i}", tasks)


def collect_pass(
    script: dict | Path, tasks_json: Path, out: Path, args, extra: list[str]
) -> tuple[dict[str, dict], float]:
    """One ``legato collect`` batch answered by ``script``; the records by task id and the
    pass's wall time [s]."""
    started = time.monotonic()
    with ScriptedPolicyServer(script=script) as server:
        command = [
            sys.executable,
            "-m",
            "legato_pipelines",
            "collect",
            "--tasks",
            str(tasks_json),
            "--osworld",
            str(OSWORLD),
            "--backend",
            args.backend,
            "--desktops",
            str(args.desktops),
            "--spares",
            "0",
            "--group",
            "1",
            "--max-steps",
            str(args.max_steps),
            "--policy-url",
            server.url,
            "--model",
            server.model,
            "--out",
            str(out),
            "--desktop-option",
            f"cache_dir={args.cache}",
            "--no-progress",
        ]
        if args.osworld_provider:
            command += ["--osworld-provider", args.osworld_provider]
        subprocess.run(command + extra, check=False)
    return {r["task_id"]: r for r in read_records(out)}, time.monotonic() - started


def _why(record: dict | None) -> str:
    if record is None:
        return "no record"
    parts = [record["status"]] if record["status"] != "ok" else []
    parts += [str(record[k])[:80] for k in ("error", "eval_error") if record.get(k)]
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="local", help="local (default) | osworld")
    parser.add_argument("--osworld-provider", help="backend osworld: e.g. local")
    parser.add_argument("--desktops", type=int, default=2, help="desktops at once (default 2)")
    parser.add_argument("--max-steps", type=int, default=20, help="policy calls per attempt")
    parser.add_argument(
        "--only", action="append", default=[], help="a domain or task id prefix (repeatable)"
    )
    parser.add_argument("--out", type=Path, help="run directory root (default: a temporary one)")
    parser.add_argument("--skip-nothing", action="store_true", help="no do-nothing pass")
    args = parser.parse_args(argv)

    entries = select(json.loads((HERE / "tasks.json").read_text()), args.only)
    out = args.out or Path(tempfile.mkdtemp(prefix="oracle-suite-"))
    out.mkdir(parents=True, exist_ok=True)
    tasks_json = out / "tasks.json"
    tasks_json.write_text(json.dumps(entries, indent=2) + "\n")
    tasks = load_tasks(tasks_json, osworld=OSWORLD)
    args.cache = out / "cache"
    fill(args.cache, list(tasks), args.desktops)
    os.environ.setdefault("PYTHONPATH", str(REPO))

    console = Console()
    console.print(f"{len(entries)} tasks, backend {args.backend}, run directory {out}")
    solved, solved_s = collect_pass(
        HERE / "scripts" / "solve.json", tasks_json, out / "solve", args, extra
    )
    nothing, nothing_s = ({}, 0.0)
    if not args.skip_nothing:
        nothing, nothing_s = collect_pass(NOTHING, tasks_json, out / "nothing", args, extra)

    table = Table(title=f"oracle suite, backend {args.backend}")
    for column in ("task", "domain", "solved", "do-nothing", "problem"):
        table.add_column(column)
    failures = 0
    for entry in entries:
        task_id = entry["task_id"]
        good, idle = solved.get(task_id), nothing.get(task_id)
        ok_solved = good is not None and good["status"] == "ok" and good["reward"] == 1.0
        ok_idle = args.skip_nothing or (idle is not None and idle["reward"] == 0.0)
        failures += not (ok_solved and ok_idle)
        problem = "" if ok_solved else _why(good)
        if not ok_idle:
            problem += f" do-nothing: {_why(idle) or 'scored ' + str(idle['reward'])}"
        table.add_row(
            task_id[:8],
            entry["domain"],
            "-" if good is None else f"[{'green' if ok_solved else 'red'}]{good['reward']}",
            "-" if idle is None else f"[{'green' if ok_idle else 'red'}]{idle['reward']}",
            problem.strip(),
        )
    console.print(table)
    console.print(
        f"solved pass {solved_s:.0f} s, do-nothing pass {nothing_s:.0f} s; "
        f"{len(entries) - failures}/{len(entries)} tasks as expected"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
