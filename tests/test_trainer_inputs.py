"""Exact model inputs from exported samples, the model files that made them, and the measured
train-inference gap (issue 32 items 1-3), against a REAL vLLM (``tests/vllm_support.py``)
serving the tiny random-weight Qwen2.5-VL.

A batch is collected with screenshots on fake desktops into a lake's run directory, its
samples written as the lake's partition; then, in the vLLM venv's interpreter (torch and
transformers; the project's own environment has neither), the rows' inputs are rebuilt with
:func:`legato_pipelines.trainer.inputs.model_inputs` and the response logprobs recomputed in
float32: they must equal vLLM's to 1e-4. The gap check must pass for the served weights and
fail for a differently seeded model of the same shape.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from legato_pipelines import DesktopConfig, PolicyConfig, collect, export_steps
from legato_pipelines.assets import checks, tables
from legato_pipelines.cli import app
from legato_pipelines.errors import ModelFilesError
from legato_pipelines.model_files import files_identity
from legato_pipelines.store.export import write_table
from legato_pipelines.store.lake import Lake, read_samples
from legato_pipelines.store.lake_tables import Lineage, samples_table
from legato_pipelines.store.rundir import read_meta
from legato_pipelines.trainer.gap import run_worker
from tests.engine_support import fake_tasks
from tests.vllm_support import build_model, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
VERSION = "step-1"
EXACT = 1e-4  # [nats] fp32 transformers against vLLM CPU on the same weights


@pytest.fixture(autouse=True)
def _no_key(monkeypatch):
    monkeypatch.delenv("LEGATO_POLICY_KEY", raising=False)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def fp32_server(request, tmp_path_factory):
    """A real vLLM server of this module's own serving a tiny model in float32
    (``--dtype float32``; the session server computes in the checkpoint's bfloat16, which
    puts ~1e-2 between any float32 recomputation and its logprobs)."""
    from tests.vllm_support import VllmServer, missing_reason

    if vllm_python() is None:
        pytest.skip(missing_reason())
    root = tmp_path_factory.mktemp(f"trainer-{request.param}")
    model = build_model(root / "model", request.param, seed=0)
    server = VllmServer(
        model,
        root / "vllm.log",
        served_name=f"tiny-{request.param}",
        extra_args=("--dtype", "float32"),
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def lake_batch(fp32_server, tmp_path_factory):
    """One batch with screenshots (2 tasks x 2 attempts, up to 2 steps, 2 images a prompt)
    collected into a lake's run directory, its samples written as the version's partition."""
    vllm_server = fp32_server
    lake = Lake(tmp_path_factory.mktemp("trainer-lake"))
    run_dir = lake.run_dir(VERSION)
    summary = collect(
        fake_tasks(2, success=0.5),
        PolicyConfig(
            base_url=vllm_server.url,
            model=vllm_server.model,
            version=VERSION,
            max_tokens=16,
            step_timeout=120.0,
            sampling_seed=7,
        ),
        run_dir,
        desktop=DesktopConfig(backend="fake"),
        desktops=1,
        group=2,
        max_steps=2,
        image_max=2,
    )
    assert summary["missing"] == 0, summary
    meta = read_meta(run_dir)
    lake.write(
        "samples",
        VERSION,
        samples_table(export_steps(run_dir), Lineage.of_run(VERSION, meta, "r1")),
    )
    return lake


def valid_rows(lake: Lake) -> list[dict]:
    rows = [r for r in read_samples(lake, [VERSION]).to_pylist() if r["logprobs_valid"]]
    assert rows, "no sample with valid logprobs"
    return rows


def test_run_and_rows_name_the_served_model_files(lake_batch, fp32_server):
    served = fp32_server.model_dir
    meta = read_meta(lake_batch.run_dir(VERSION))
    files = files_identity(served)
    # vLLM's /v1/models root is the folder it was started from: its files are hashed
    assert meta["model_files"]["source"] == "server_root"
    assert Path(meta["model_files"]["root"]) == served
    for key in ("tokenizer_sha256", "chat_template_sha256", "processor_sha256"):
        assert meta["model_files"][key] == files[key] and files[key]
    for row in valid_rows(lake_batch):
        assert row["tokenizer_sha256"] == files["tokenizer_sha256"]
        assert row["chat_template_sha256"] == files["chat_template_sha256"]
        assert row["processor_sha256"] == files["processor_sha256"]
        assert row["model_files_root"] == str(served)
        # the screenshots in placeholder order: as many as the prompt's image runs
        assert row["image_shas"] and all(len(s) == 64 for s in row["image_shas"])


RECOMPUTE = r"""
import json, sys
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor
from legato_pipelines.trainer.inputs import SampleDataset, response_logprobs

rows_path, model_dir, images = sys.argv[1:4]
rows = [json.loads(line) for line in open(rows_path)]
processor = AutoProcessor.from_pretrained(model_dir)
model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
data = SampleDataset(rows, processor, images)  # model_inputs of each row
assert isinstance(data, torch.utils.data.Dataset) and len(data) == len(rows)
out = []
for inputs in torch.utils.data.DataLoader(data, batch_size=None, collate_fn=lambda x: x):
    row = inputs["row"]
    with_types = response_logprobs(model, inputs).tolist()
    inputs.pop("mm_token_type_ids")
    try:  # Qwen2.5-VL falls back to 1-D positions; Qwen3-VL (transformers 5.19) refuses
        without = response_logprobs(model, inputs).tolist()
    except ValueError as exc:
        without = str(exc)
    out.append({"old": row["response_logprobs"], "with": with_types, "without": without,
                "images": len(inputs["images"]), "grid": inputs["image_grid_thw"].tolist()})
print(json.dumps(out))
"""


def venv_run(code: str, *args: str) -> str:
    python = vllm_python()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(python), "-c", code, *args], capture_output=True, text=True, env=env, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_recomputed_logprobs_match_vllm_only_with_mm_token_type_ids(
    lake_batch, fp32_server, tmp_path
):
    rows = valid_rows(lake_batch)
    path = write_table(read_samples(lake_batch, [VERSION]), tmp_path / "rows.jsonl")
    images = lake_batch.run_dir(VERSION) / "images"
    out = json.loads(venv_run(RECOMPUTE, str(path), str(fp32_server.model_dir), str(images)))
    assert len(out) == len(rows)
    worst = worst_without = 0.0
    refused = 0
    for item in out:
        assert item["images"] >= 1 and len(item["grid"]) == item["images"]
        assert len(item["with"]) == len(item["old"])
        worst = max([worst, *(abs(a - b) for a, b in zip(item["with"], item["old"], strict=True))])
        if isinstance(item["without"], str):
            assert "mm_token_type_ids" in item["without"]
            refused += 1
            continue
        diffs = (abs(a - b) for a, b in zip(item["without"], item["old"], strict=True))
        worst_without = max([worst_without, *diffs])
    arch = json.loads((fp32_server.model_dir / "config.json").read_text())["model_type"]
    print(
        f"\nmeasured ({arch}): max |dlogp| with mm_token_type_ids {worst:.3g}; without: "
        f"{worst_without:.3g} ({refused} of {len(out)} refused by transformers)"
    )
    assert worst <= EXACT, worst
    if arch == "qwen2_5_vl":
        # the trap: without mm_token_type_ids transformers falls back to 1-D positions, silently
        assert refused == 0
        assert worst_without > 10 * EXACT and worst_without > 10 * worst, (worst, worst_without)
    else:  # Qwen3-VL: transformers refuses the call instead
        assert refused == len(out) or worst_without > 10 * EXACT, (refused, worst_without)


def figures(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "per_row"}


def test_gap_passes_the_served_weights_and_flags_other_weights(lake_batch, fp32_server, tmp_path):
    served = fp32_server.model_dir
    arch = json.loads((served / "config.json").read_text())["model_type"]
    other = build_model(tmp_path / "other-seed", arch, seed=1)
    assert files_identity(other)["tokenizer_sha256"] == files_identity(served)["tokenizer_sha256"]
    rows = valid_rows(lake_batch)
    images = lake_batch.run_dir(VERSION) / "images"
    python = vllm_python()

    same = run_worker(rows, served, images, python=python)
    assert same["tokens"] == sum(len(r["response_token_ids"]) for r in rows)
    assert same["max_abs_dlogp"] <= EXACT and same["k3_kl"] <= EXACT
    assert 1 - 1e-3 < same["ratio_min"] <= same["ratio_max"] < 1 + 1e-3
    passed = checks.train_inference_gap(same, max_mean_abs=0.05)
    assert passed.passed and passed.metadata["mean_abs_dlogp"].value == same["mean_abs_dlogp"]
    # what the training_samples asset evaluates when LEGATO_GAP_MODEL is set
    config = tables.SamplesConfig(gap_model=str(served), gap_python=str(python), gap_rows=3)
    result = tables._gap_result(config, lake_batch, VERSION)
    assert result.passed and result.metadata["rows"].value == 3

    print(f"\nmeasured: served weights {figures(same)}")
    differ = run_worker(rows, other, images, python=python)
    print(f"\nmeasured: other weights {figures(differ)}")
    assert differ["mean_abs_dlogp"] > 0.05 and differ["k3_kl"] > 0.01
    failed = checks.train_inference_gap(differ, max_mean_abs=0.05)
    assert not failed.passed
    config = tables.SamplesConfig(gap_model=str(other), gap_python=str(python), gap_rows=3)
    assert not tables._gap_result(config, lake_batch, VERSION).passed
    assert {"max_abs_dlogp", "k3_kl", "ratio_p05", "ratio_p95"} <= set(failed.metadata)

    # the CLI, as a user runs it: exit 0 on the served weights, 1 on the others
    base = ["lake", "gap", VERSION, "--lake", str(lake_batch.root), "--python", str(python)]
    ok = CliRunner().invoke(app, [*base, "--model", str(served), "--rows", "2", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["passed"] is True
    bad = CliRunner().invoke(app, [*base, "--model", str(other), "--rows", "2", "--json"])
    assert bad.exit_code == 1, bad.output
    assert json.loads(bad.stdout.splitlines()[0])["passed"] is False


def test_rows_of_other_model_files_are_refused(lake_batch, fp32_server, tmp_path):
    served = fp32_server.model_dir
    edited = tmp_path / "edited-template"
    shutil.copytree(served, edited)
    jinja = edited / "chat_template.jinja"
    jinja.write_text(jinja.read_text().replace("You are a helpful assistant.", "Be brief."))
    rows = valid_rows(lake_batch)[:1]
    images = lake_batch.run_dir(VERSION) / "images"
    with pytest.raises(ModelFilesError, match="chat_template_sha256"):
        run_worker(rows, served, images, python=vllm_python(), processor=edited)
    # rows that name no model files are refused unless the trainer says it knows better
    unknown = [{**rows[0], "tokenizer_sha256": None}]
    with pytest.raises(ModelFilesError, match="tokenizer_sha256 is null"):
        run_worker(unknown, served, images, python=vllm_python())
    known = run_worker(unknown, served, images, python=vllm_python(), identity="if-known")
    assert known["max_abs_dlogp"] <= EXACT
    # a response in which the model sampled <|image_pad|> (the closed loop met one in 48 rows):
    # refused by name, not transformers' "Image features and image tokens do not match"
    added = json.loads((served / "tokenizer.json").read_text())["added_tokens"]
    pad = next(t["id"] for t in added if t["content"] == "<|image_pad|>")
    sampled = [{**rows[0], "response_token_ids": [*rows[0]["response_token_ids"], pad],
                "response_logprobs": [*rows[0]["response_logprobs"], -1.0]}]  # fmt: skip
    with pytest.raises(ModelFilesError, match="vision placeholder token"):
        run_worker(sampled, served, images, python=vllm_python())
