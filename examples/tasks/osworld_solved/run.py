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

The desktops are ``legato collect``'s defaults for OSWorld's tasks (a 1920x1080 screen and, on
the local backend, ``session=vm``, the look of OSWorld's GNOME VM: desktops/task_defaults.py):
no script depends on the screen's size or the session (``build.py``).

Prints one row per task (reward solved, reward doing nothing, the record's status and error
when not ``ok``) and the wall time of each pass. Exit status 0 only when every task scores 1
solved and 0 doing nothing; 1 otherwise; 2 on a bad argument. Arguments after ``--`` go to
``legato collect`` unchanged and win over its defaults (e.g. ``-- --desktop-option
ready_app_window_s=60``, ``-- --screen 1280x720 --desktop-option session=plain``).
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
from dataclasses import dataclass
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

#: The solving scripts (``build.py`` writes them).
SOLVE = HERE / "scripts" / "solve.json"
#: Screenshots kept in the prompt (collect's ``--image-max``, default 20). The scripted server
#: knows a task's step by the assistant turns in the request, and a prompt keeps one per kept
#: screenshot: with 20, step 20 and later were answered as step 19, so a script of more than 20
#: responses never reached its end (two LibreOffice scripts of 21). ``build.py`` keeps every
#: script within it.
IMAGE_MAX = 40
#: The do-nothing policy: every task's first answer ends the attempt as done.
NOTHING = {"default": [qwen_response("Done.", {"action": "terminate", "status": "success"})]}


def _sibling(name: str):
    """``<name>.py`` beside this file (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location(f"osworld_solved_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def select(entries: list[dict], only: list[str]) -> list[dict]:
    """The task list entries whose domain or task id prefix is in ``only`` (all when empty).

    Raises ``ValueError`` naming a selector that matches no task."""
    if not only:
        return entries
    for selector in only:
        if not any(e["domain"] == selector or e["task_id"].startswith(selector) for e in entries):
            raise ValueError(f"--only {selector!r}: no task has that domain or id prefix")
    return [e for e in entries if any(e["domain"] == s or e["task_id"].startswith(s) for s in only)]


def fill(cache: Path, tasks, desktops: int) -> None:
    """Build the tasks' files into ``cache`` for both backends' layouts (module doc)."""
    fill_cache = _sibling("files").fill_cache
    fill_cache(cache, tasks)
    for i in range(desktops):
        fill_cache(cache / f"desktop-{i}", tasks)


def collect_pass(
    script: dict | Path, tasks_json: Path, out: Path, cache: Path, collect_args: list[str]
) -> tuple[dict[str, dict], float]:
    """One ``legato collect`` batch of ``tasks_json`` answered by ``script`` into ``out``; the
    records by task id and the pass's wall time [s]. ``collect_args``: collect's backend
    options (``--backend``, ``--desktops`` ...)."""
    started = time.monotonic()
    with ScriptedPolicyServer(script=script) as server:
        command = [
            *(sys.executable, "-m", "legato_pipelines", "collect"),
            *("--tasks", str(tasks_json), "--osworld", str(OSWORLD)),
            *("--spares", "0", "--group", "1"),
            *("--policy-url", server.url, "--model", server.model, "--out", str(out)),
            *("--desktop-option", f"cache_dir={cache}", "--no-progress"),
            *collect_args,
        ]
        subprocess.run(command, check=False)
    return {r["task_id"]: r for r in read_records(out)}, time.monotonic() - started


@dataclass
class Outcome:
    """One task's two attempts: ``solved`` (its script) and ``idle`` (doing nothing); a record
    is ``None`` when its pass wrote none."""

    task_id: str
    domain: str
    solved: dict | None
    idle: dict | None
    check_idle: bool = True

    @property
    def solved_ok(self) -> bool:
        """The script's attempt ended ``ok`` and scored 1."""
        return bool(self.solved) and self.solved["status"] == "ok" and self.solved["reward"] == 1.0

    @property
    def idle_ok(self) -> bool:
        """Doing nothing scored 0 (or that pass was skipped)."""
        return not self.check_idle or (bool(self.idle) and self.idle["reward"] == 0.0)

    @property
    def ok(self) -> bool:
        return self.solved_ok and self.idle_ok

    def problem(self) -> str:
        """Why the task is not as expected ('' when it is)."""
        text = "" if self.solved_ok else _why(self.solved)
        if not self.idle_ok:
            text += f" do-nothing: {_why(self.idle) or 'scored ' + str(self.idle['reward'])}"
        return text.strip()


def run_suite(
    entries: list[dict],
    out: Path,
    collect_args: list[str],
    *,
    desktops: int = 2,
    nothing: bool = True,
) -> tuple[list[Outcome], dict[str, float]]:
    """Run ``entries`` (task list entries) with the solving scripts, then (``nothing``) with the
    do-nothing policy, through ``legato collect`` with ``collect_args`` into ``out/solve`` and
    ``out/nothing``; each task's :class:`Outcome` and each pass's wall time [s]."""
    out.mkdir(parents=True, exist_ok=True)
    tasks_json = out / "tasks.json"
    tasks_json.write_text(json.dumps(entries, indent=2) + "\n")
    cache = out / "cache"
    fill(cache, list(load_tasks(tasks_json, osworld=OSWORLD)), desktops)
    args = ["--desktops", str(desktops), "--image-max", str(IMAGE_MAX), *collect_args]
    solved, solved_s = collect_pass(SOLVE, tasks_json, out / "solve", cache, args)
    idle, idle_s = (
        collect_pass(NOTHING, tasks_json, out / "nothing", cache, args) if nothing else ({}, 0.0)
    )
    outcomes = [
        Outcome(
            e["task_id"], e["domain"], solved.get(e["task_id"]), idle.get(e["task_id"]), nothing
        )
        for e in entries
    ]
    return outcomes, {"solved": solved_s, "nothing": idle_s}


def _why(record: dict | None) -> str:
    if record is None:
        return "no record"
    parts = [record["status"]] if record["status"] != "ok" else []
    parts += [str(record[k])[:80] for k in ("error", "eval_error") if record.get(k)]
    return " ".join(parts) or f"scored {record['reward']}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="local", help="local (default) | osworld")
    parser.add_argument("--osworld-provider", help="backend osworld: e.g. local")
    parser.add_argument("--desktops", type=int, default=2, help="desktops at once (default 2)")
    parser.add_argument("--max-steps", type=int, default=25, help="policy calls per attempt")
    parser.add_argument(
        "--only", action="append", default=[], help="a domain or task id prefix (repeatable)"
    )
    parser.add_argument("--out", type=Path, help="run directory root (default: a temporary one)")
    parser.add_argument("--skip-nothing", action="store_true", help="no do-nothing pass")
    args = parser.parse_args(argv)

    try:
        entries = select(json.loads((HERE / "tasks.json").read_text()), args.only)
    except ValueError as error:
        parser.error(str(error))  # exit status 2
    out = args.out or Path(tempfile.mkdtemp(prefix="oracle-suite-"))
    collect_args = ["--backend", args.backend, "--max-steps", str(args.max_steps)]
    if args.osworld_provider:
        collect_args += ["--osworld-provider", args.osworld_provider]
    os.environ.setdefault("PYTHONPATH", str(REPO))

    console = Console()
    console.print(f"{len(entries)} tasks, backend {args.backend}, run directory {out}")
    outcomes, seconds = run_suite(
        entries,
        out,
        collect_args + extra,
        desktops=args.desktops,
        nothing=not args.skip_nothing,
    )
    table = Table(title=f"oracle suite, backend {args.backend}")
    for column in ("task", "domain", "solved", "do-nothing", "problem"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(
            o.task_id[:8],
            o.domain,
            "-"
            if o.solved is None
            else f"[{'green' if o.solved_ok else 'red'}]{o.solved['reward']}",
            "-" if o.idle is None else f"[{'green' if o.idle_ok else 'red'}]{o.idle['reward']}",
            o.problem(),
        )
    console.print(table)
    good = sum(o.ok for o in outcomes)
    console.print(
        f"solved pass {seconds['solved']:.0f} s, do-nothing pass {seconds['nothing']:.0f} s; "
        f"{good}/{len(outcomes)} tasks as expected"
    )
    return 0 if good == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
