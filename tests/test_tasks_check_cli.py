"""``legato tasks check`` as a user runs it: a subprocess, real files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCAL_SUITE = ROOT / "examples" / "tasks" / "local" / "tasks.json"
OSWORLD = Path("/work/shared/data/osworld")


def legato(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "tasks", "check", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_json_over_the_local_suite():
    proc = legato(str(LOCAL_SUITE), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = orjson.loads(proc.stdout)
    ids = [entry["task_id"] for entry in orjson.loads(LOCAL_SUITE.read_bytes())]
    assert [t["task_id"] for t in doc["tasks"]] == ids
    totals = doc["totals"]
    assert totals["tasks"] == len(ids)
    assert totals["by_backend"]["local"] == len(ids)
    assert totals["needs_internet"] == 0 and totals["full_reset"] == 0
    assert len(doc["task_set"]) == 16


@pytest.mark.skipif(
    not (OSWORLD / "test_all.json").is_file(), reason="OSWorld task configs not present"
)
def test_osworld_dir_defaults_to_test_all(tmp_path):
    proc = legato("--osworld", str(OSWORLD), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = orjson.loads(proc.stdout)
    index = orjson.loads((OSWORLD / "test_all.json").read_bytes())
    assert doc["totals"]["tasks"] == sum(len(v) for v in index.values())
    assert doc["path"].endswith("test_all.json")
    # an index name relative to --osworld works too, and gives the same task set
    small = legato("test_small.json", "--osworld", str(OSWORLD), "--json", cwd=tmp_path)
    assert small.returncode == 0, small.stderr
    small_index = orjson.loads((OSWORLD / "test_small.json").read_bytes())
    assert orjson.loads(small.stdout)["totals"]["tasks"] == sum(
        len(v) for v in small_index.values()
    )


def test_table_output_has_totals():
    proc = legato(str(LOCAL_SUITE))
    assert proc.returncode == 0, proc.stderr
    assert "totals" in proc.stdout and "runnable on local" in proc.stdout


def test_bad_task_list_names_the_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(
        orjson.dumps(
            [{"task_id": "a", "config": {"instruction": "x", "config": [{"parameters": {}}]}}]
        )
    )
    proc = legato(str(bad), "--json")
    assert proc.returncode == 2
    assert "config.config[0].type" in proc.stderr and proc.stdout == ""
    missing = legato(str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
