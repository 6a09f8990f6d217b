"""The identity of the files that made the ids (legato_pipelines/model_files.py), the rows'
columns that carry it, the trainer's refusal of other files, and the gap's figures: the parts
that need no model (the real-vLLM side is tests/test_trainer_inputs.py)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect, export_steps
from legato_pipelines.errors import ModelFilesError, ResumeError
from legato_pipelines.model_files import base_root, files_identity, served_identity
from legato_pipelines.store.rundir import RunWriter, read_meta
from legato_pipelines.trainer.gap import gap_stats
from legato_pipelines.trainer.inputs import check_model_files
from tests.engine_support import fake_tasks

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def model_folder(root: Path, template: str = TEMPLATE) -> Path:
    root.mkdir(parents=True)
    (root / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    (root / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "Qwen2Tokenizer", "chat_template": template})
    )
    (root / "preprocessor_config.json").write_text(
        json.dumps({"max_pixels": 3136, "merge_size": 2})
    )
    (root / "config.json").write_text("{}")
    return root


def test_files_identity_tells_each_part_apart(tmp_path):
    base = files_identity(model_folder(tmp_path / "a"))
    assert all(base[k] for k in ("tokenizer_sha256", "chat_template_sha256", "processor_sha256"))
    # the same files elsewhere: the same identity
    same = files_identity(shutil.copytree(tmp_path / "a", tmp_path / "copy"))
    assert {k: v for k, v in same.items() if k != "root"} == {
        k: v for k, v in base.items() if k != "root"
    }
    # another template, in tokenizer_config.json: only the template's hash moves
    other = files_identity(model_folder(tmp_path / "b", TEMPLATE + "x"))
    assert other["chat_template_sha256"] != base["chat_template_sha256"]
    assert other["tokenizer_sha256"] == base["tokenizer_sha256"]
    assert other["processor_sha256"] == base["processor_sha256"]
    # chat_template.jinja wins over tokenizer_config.json, as in transformers
    (tmp_path / "b" / "chat_template.jinja").write_text(TEMPLATE)
    assert files_identity(tmp_path / "b")["chat_template_sha256"] == base["chat_template_sha256"]
    # another image processor setting
    (tmp_path / "b" / "preprocessor_config.json").write_text(json.dumps({"max_pixels": 1}))
    assert files_identity(tmp_path / "b")["processor_sha256"] != base["processor_sha256"]


def test_served_identity_follows_an_adapter_to_its_base(tmp_path):
    folder = model_folder(tmp_path / "base")
    listing = [
        {"id": "base", "root": str(folder), "parent": None},
        {"id": "step-3", "root": str(tmp_path / "lora"), "parent": "base"},
    ]
    assert base_root(listing, "step-3") == str(folder)
    found = served_identity(listing, "step-3")
    assert found["source"] == "server_root" and found["root"] == str(folder)
    assert found["tokenizer_sha256"] == files_identity(folder)["tokenizer_sha256"]
    # a root that is no folder here (a remote server, a hub id): named, not hashed
    remote = served_identity([{"id": "m", "root": "Qwen/Qwen2.5-VL-3B-Instruct"}], "m")
    assert remote["source"] == "unreadable" and remote["tokenizer_sha256"] is None
    assert served_identity([], "m")["source"] == "unreported"


def test_rows_carry_model_files_and_screenshots_in_order(policy_server, tmp_path):
    summary = collect(
        fake_tasks(1),
        PolicyConfig(base_url=policy_server.url, model=policy_server.model, version="v1"),
        tmp_path / "run",
        desktop=DesktopConfig(backend="fake"),
        desktops=1,
        group=2,
        max_steps=2,
        image_max=2,
    )
    assert summary["missing"] == 0
    meta = read_meta(tmp_path / "run")
    # the scripted server's root is its model name, no folder: the run says so
    assert meta["model_files"]["source"] == "unreadable"
    rows = export_steps(tmp_path / "run").to_pylist()
    assert rows
    for row in rows:
        assert row["model_files_root"] == policy_server.model
        assert row["tokenizer_sha256"] is None
        refs = [
            part["image_url"]["url"].removeprefix("legato-image://")
            for message in json.loads(row["messages"])
            if isinstance(message["content"], list)
            for part in message["content"]
            if part.get("type") == "image_url"
        ]
        assert row["image_shas"] == refs and refs
        assert all((tmp_path / "run" / "images" / f"{s}.png").is_file() for s in refs)


def processor_of(folder: Path, template: str = TEMPLATE):
    """What check_model_files reads of a processor: its tokenizer's folder and its template."""
    return SimpleNamespace(
        tokenizer=SimpleNamespace(name_or_path=str(folder), chat_template=template),
        chat_template=template,
    )


def test_trainer_refuses_other_or_unknown_model_files(tmp_path):
    folder = model_folder(tmp_path / "served")
    row = {"rollout_id": "r", "step": 0, "model_files_root": str(folder), **files_identity(folder)}
    check_model_files([row], processor_of(folder))  # the same files: accepted
    with pytest.raises(ModelFilesError, match="chat_template_sha256"):
        check_model_files([row], processor_of(folder, TEMPLATE + " "))
    other = model_folder(tmp_path / "other")
    (other / "preprocessor_config.json").write_text(json.dumps({"max_pixels": 1}))
    with pytest.raises(ModelFilesError, match="processor_sha256"):
        check_model_files([row], processor_of(other))
    with pytest.raises(ModelFilesError, match="processor's tokenizer files are unknown"):
        check_model_files([row], processor_of(tmp_path / "nowhere"))
    unknown = {**row, "tokenizer_sha256": None}
    with pytest.raises(ModelFilesError, match="tokenizer_sha256 is null"):
        check_model_files([unknown], processor_of(folder))
    check_model_files([unknown], processor_of(folder), identity="if-known")


def test_gap_stats():
    pairs = [(-1.0, -1.0), (-2.0, -2.0 + math.log(2)), (-0.5, -0.5 - math.log(2)), (None, -1.0)]
    stats = gap_stats(pairs)
    assert stats["tokens"] == 3 and stats["skipped_tokens"] == 1
    assert stats["mean_abs_dlogp"] == pytest.approx(2 * math.log(2) / 3)
    assert stats["max_abs_dlogp"] == pytest.approx(math.log(2))
    assert stats["ratio_min"] == pytest.approx(0.5) and stats["ratio_max"] == pytest.approx(2.0)
    # k3: mean of (r - 1) - log r over r = 1, 2, 1/2
    k3 = ((2 - 1 - math.log(2)) + (0.5 - 1 + math.log(2))) / 3
    assert stats["k3_kl"] == pytest.approx(k3) and stats["k3_kl"] > 0
    assert gap_stats([])["mean_abs_dlogp"] is None


def test_resume_refuses_other_model_files(policy_server, tmp_path):
    out = tmp_path / "run"
    collect(
        fake_tasks(1),
        PolicyConfig(base_url=policy_server.url, model=policy_server.model, version="v1"),
        out,
        desktop=DesktopConfig(backend="fake"),
        desktops=1,
        group=1,
        max_steps=1,
    )
    meta = read_meta(out)
    first = {"root": "/models/a", "source": "server_root", "tokenizer_sha256": "a" * 64}
    (out / "run.json").write_text(json.dumps({**meta, "model_files": first}))
    RunWriter(out).check({**meta, "model_files": first})  # the same files: resumable
    unknown = {"root": "m", "source": "unreadable", "tokenizer_sha256": None}
    RunWriter(out).check({**meta, "model_files": unknown})  # nothing to compare
    other = {**first, "root": "/models/b", "tokenizer_sha256": "b" * 64}
    with pytest.raises(ResumeError, match="tokenizer_sha256"):
        RunWriter(out).check({**meta, "model_files": other})


@pytest.mark.slow
@pytest.mark.parametrize("model", ["", "/models/step-7"])
def test_gap_check_exists_only_with_a_gap_model(model):
    code = (
        "import legato_pipelines.definitions as d; "
        "print(sorted(k.name for k in d.defs.resolve_asset_graph().asset_check_keys))"
    )
    env = {k: v for k, v in os.environ.items() if k != "LEGATO_GAP_MODEL"}
    if model:
        env["LEGATO_GAP_MODEL"] = model
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("train_inference_gap" in done.stdout) == bool(model), done.stdout
    assert "logprobs_coverage" in done.stdout
