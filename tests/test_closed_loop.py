"""The closed loop of ``examples/closed_loop/run.py`` at its smallest (issue 32 item 6): two
policy versions, one local task, a group of 2, one trainer step, with real parts: a real vLLM
(CPU, float32) serving a tiny random-weight Qwen3-VL, real Xvfb desktops, the project's
checkpoint sensor and Dagster runs, the lake, and the gap check in transformers.

What is asserted is read back here, not taken from the script's word: the lake's rows of each
version name the adapter that produced them (served model = the version, the folder, its
fingerprint recomputed here), the step-1 adapter holds other weights than step-0's (the
trainer step wrote them from step-0's rows), the Dagster runs carry the sensor's tags and the
gap check passed on each, and step-1's rows recomputed with step-0's weights differ.
The full-size loop is a timed job (BENCHMARKS.md, "Closed loop on one machine").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from legato_pipelines.policy.loading import fingerprint
from legato_pipelines.store.lake import Lake
from legato_pipelines.trainer.gap import DEFAULT_MAX_MEAN_ABS
from tests.vllm_support import missing_reason, vllm_python

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.desktop,
    pytest.mark.skipif(vllm_python() is None, reason=missing_reason()),
    pytest.mark.skipif(
        not all(shutil.which(a) for a in ("Xvfb", "openbox", "xterm", "l3afpad")),
        reason="needs Xvfb and apps",
    ),
]


def test_two_versions_round_the_loop_with_real_parts(tmp_path, monkeypatch):
    work = tmp_path / "loop"
    env = {k: v for k, v in os.environ.items() if k not in ("LEGATO_POLICY_KEY",)}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [
            sys.executable, str(REPO / "examples" / "closed_loop" / "run.py"),
            "--work", str(work), "--versions", "2", "--tasks", "1", "--group", "2",
            "--gap-rows", "3", "--json",
        ],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
    report = json.loads(done.stdout)
    assert report["ok"] and [v["version"] for v in report["versions"]] == ["step-0", "step-1"]

    ckpts = work / "ckpts"
    a0 = (ckpts / "step-0" / "adapter_model.safetensors").read_bytes()
    a1 = (ckpts / "step-1" / "adapter_model.safetensors").read_bytes()
    assert len(a0) == len(a1) and a0 != a1  # same shapes, other weights

    lake = Lake(work / "lake")
    for version in ("step-0", "step-1"):
        rows = lake.query(
            "SELECT served_model, checkpoint_path, checkpoint_fingerprint, logprobs_valid "
            f"FROM samples WHERE policy_version = '{version}'"
        ).to_pylist()
        assert rows, version
        assert {r["served_model"] for r in rows} == {version}
        assert {r["checkpoint_path"] for r in rows} == {str((ckpts / version).resolve())}
        assert {r["checkpoint_fingerprint"] for r in rows} == {
            fingerprint(ckpts / version)["digest"]
        }
        assert all(r["logprobs_valid"] for r in rows)

    by_version = {v["version"]: v for v in report["versions"]}
    trained = by_version["step-1"]["trainer"]
    assert trained["rows_used"] >= 1 and trained["update_l2"] > 0
    # the trainer's recomputation of step-0's rows with step-0's weights: ratios ~1
    assert abs(trained["mean_ratio"] - 1.0) < 1e-3
    for version, entry in by_version.items():
        assert entry["load"] == "lora: loaded", version
        gap = entry["gap_check"]
        assert gap["passed"] and gap["mean_abs_dlogp"] < DEFAULT_MAX_MEAN_ABS, version
        assert gap["model"] == str(work / "merged" / version)
    assert by_version["step-1"]["gap_vs_previous"]["mean_abs_dlogp"] > DEFAULT_MAX_MEAN_ABS

    # the Dagster runs: one per version, launched from the sensor's request (its tags)
    import dagster as dg

    monkeypatch.setenv("DAGSTER_HOME", str(work / "dagster"))
    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs()
        tags = {r.tags.get("dagster/partition"): r.tags for r in runs}
        assert set(tags) == {"step-0", "step-1"}
        for version, t in tags.items():
            assert t["legato/policy_version"] == version
            assert Path(t["legato/checkpoint"]).resolve() == (ckpts / version).resolve()
