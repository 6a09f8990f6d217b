"""Terminate at once on every test_all task ``--backend local`` can run without a file cache,
on ``local`` (OSWorld's own code attached to each desktop) and on ``osworld
--osworld-provider local``, through ``legato collect``; print what differs.

    PYTHONPATH=. python scripts/compare_graders.py [--out DIR] [--desktops 1]

For each task the scripted policy answers one ``terminate`` (``failure`` for infeasible
tasks, else ``success``). Prints, per task that is not "setup clean, reward 0 (1 for
infeasible), same on both backends": both rewards, the setup failures' step types and the
evaluator errors. Exit status 1 when the backends disagree on a reward. Takes ~5 min per
backend on 2 busy cores; not a test (too slow for the suite): tests/test_local_osworld_grader.py
runs five such tasks, with files, on both backends.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from legato_pipelines import read_records
from legato_pipelines.desktops.support import backend_support
from legato_pipelines.osworld_format import classify_task
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[1]
OSWORLD = ROOT / "tests" / "data" / "osworld"
TERMINATE = (
    "Action: done.\n<tool_call>\n"
    '{{"name": "computer_use", "arguments": {{"action": "terminate", "status": "{}"}}}}'
    "\n</tool_call>"
)


def _workload(out: Path) -> dict[str, float]:
    """Write tasks.json and script.json into ``out``; the expected reward per task id."""
    support = backend_support("local", {})
    entries, script, expected = [], {}, {}
    for task in load_tasks(OSWORLD / "test_all.json"):
        if "local" not in classify_task(task, backend_support=support).backends:
            continue
        infeasible = task.evaluator.get("func") == "infeasible"
        entries.append({"task_id": task.task_id, "domain": task.domain})
        script[task.instruction] = [TERMINATE.format("failure" if infeasible else "success")]
        expected[task.task_id] = 1.0 if infeasible else 0.0
    (out / "tasks.json").write_bytes(orjson.dumps(entries))
    (out / "script.json").write_bytes(orjson.dumps({"tasks": script}))
    return expected


def _collect(out: Path, name: str, desktops: int, *backend: str) -> dict[str, dict]:
    with ScriptedPolicyServer(flavor="vllm", script=out / "script.json") as server:
        proc = subprocess.run(
            [
                sys.executable, "-m", "legato_pipelines", "collect", *backend,
                "--tasks", str(out / "tasks.json"), "--osworld", str(OSWORLD),
                "--policy-url", server.url, "--model", server.model, "--out", str(out / name),
                "--desktops", str(desktops), "--group", "1", "--max-steps", "3", "--json",
            ],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"{name}: legato collect failed:\n{proc.stderr[-3000:]}")
    return {r["task_id"]: r for r in read_records(out / name)}


def _facts(record: dict) -> tuple[list, str]:
    failures = (record.get("reset") or {}).get("setup_failures") or []
    return [f.get("type") for f in failures], (record.get("eval_error") or "")[:120]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--desktops", type=int, default=1)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="legato-compare-graders-"))
    out.mkdir(parents=True, exist_ok=True)
    expected = _workload(out)
    local = _collect(out, "local", args.desktops, "--backend", "local")
    osworld = _collect(
        out, "osworld", args.desktops, "--backend", "osworld", "--osworld-provider", "local",
        "--desktop-option", f"work_dir={out / 'work'}", "--desktop-option", f"cache_dir={out / 'cache'}",
    )  # fmt: skip
    disagree = 0
    for task_id, want in expected.items():
        a, b = local[task_id], osworld[task_id]
        disagree += a["reward"] != b["reward"]
        if a["reward"] == b["reward"] == want and _facts(a) == _facts(b) == ([], ""):
            continue
        print(
            f"{task_id[:8]} local {a['reward']} osworld {b['reward']} (want {want}); "
            f"local {_facts(a)}; osworld {_facts(b)}"
        )
    print(f"{len(expected)} tasks; rewards differ on {disagree}; records in {out}")
    sys.exit(1 if disagree else 0)


if __name__ == "__main__":
    main()
