"""A partition's samples in verl's, prime-rl's, SkyRL's and TRL's records (issue 32 item 4,
legato_pipelines/trainer/formats.py): a real lake built by a real collection (the scripted
vLLM-flavoured policy server, fake desktops), exported by the real CLI, read back from
Parquet and compared with the lake row by row."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from legato_pipelines import DesktopConfig, PolicyConfig, collect, export_steps
from legato_pipelines.cli import app
from legato_pipelines.errors import ModelFilesError
from legato_pipelines.model_files import IDENTITY_KEYS
from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer
from legato_pipelines.store.lake import RECORDS_FILE, Lake, read_samples
from legato_pipelines.store.lake_tables import Lineage, samples_table
from legato_pipelines.trainer.formats import (
    SKYRL_KEYS,
    skyrl_generator_output,
    training_rows,
    trl_batch,
    verl_batch,
)
from legato_pipelines.trainer.inputs import check_model_files
from tests.engine_support import fake_tasks

VERSION = "step-1"
FIELDS = {  # the trainer's own field names each record must carry
    "verl": {
        "prompt_ids",
        "response_ids",
        "response_mask",
        "response_logprobs",
        "multi_modal_data",
        "reward_score",
        "num_turns",
        "uid",
        "advantages",
    },
    "prime-rl": {"token_ids", "mask", "logprobs", "temperatures", "env_name", "advantages"},
    "skyrl": set(SKYRL_KEYS),
    "trl": {
        "prompt_ids",
        "completion_ids",
        "completion_mask",
        "advantages",
        "sampling_per_token_logps",
        "old_per_token_logps",
        "num_images",
    },
}


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    """A lake with one version: 3 tasks x 2 attempts x up to 3 steps, screenshots kept 2 at a
    time (multi-image prompts), every 7th model call with a sentinel logprob, and one group cut
    short (its second attempt's record removed, as an interrupted collection leaves it)."""
    root = tmp_path_factory.mktemp("formats")
    store = Lake(root / "lake")
    run = store.run_dir(VERSION)
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(sentinel_every=7)) as server:
        summary = collect(
            fake_tasks(3),
            PolicyConfig(base_url=server.url, model=server.model, version=VERSION),
            run,
            desktop=DesktopConfig(backend="fake"),
            desktops=1,
            group=2,
            max_steps=3,
            image_max=2,
        )
    assert summary["missing"] == 0
    records = (run / RECORDS_FILE).read_text().splitlines()
    cut = next(i for i, line in enumerate(records) if json.loads(line)["task_id"] == "fake-001")
    (run / RECORDS_FILE).write_text("".join(f"{r}\n" for i, r in enumerate(records) if i != cut))
    store.write(
        "samples",
        VERSION,
        samples_table(export_steps(run), Lineage(VERSION, summary["task_set"], "r")),
    )
    store.refresh_views()
    return store


def _lake_rows(lake: Lake) -> dict[tuple[str, int], dict]:
    return {(r["rollout_id"], r["step"]): r for r in read_samples(lake, [VERSION]).to_pylist()}


def test_training_rows_leave_out_incomplete_groups_and_invalid_logprobs(lake):
    every = _lake_rows(lake)
    incomplete = {k for k, r in every.items() if r["group_complete"] is not True}
    invalid = {k for k, r in every.items() if r["logprobs_valid"] is not True}
    assert incomplete and invalid, "the fixture must hold both kinds"
    assert all(every[k]["advantage"] is None for k in incomplete)

    rows, dropped = training_rows(lake, VERSION)
    kept = {(r["rollout_id"], r["step"]) for r in rows}
    assert kept == set(every) - incomplete - invalid
    assert dropped["invalid_logprobs"] == len(invalid)
    assert dropped["incomplete_group"] == len(incomplete - invalid)
    assert all(r["advantage"] is not None for r in rows)

    wide, _ = training_rows(lake, VERSION, include_incomplete=True, include_invalid=True)
    assert {(r["rollout_id"], r["step"]) for r in wide} == set(every)
    # each attempt's last kept model call is marked, the attempt's rows together, in order
    for selection in (rows, wide):
        last = {}
        for r in selection:
            last[r["rollout_id"]] = max(last.get(r["rollout_id"], -1), r["step"])
        marked = {(r["rollout_id"], r["step"]) for r in selection if r["is_last_step"]}
        assert marked == set(last.items())
        order = [(r["rollout_id"], r["step"]) for r in selection]
        runs = [rid for i, (rid, _) in enumerate(order) if i == 0 or order[i - 1][0] != rid]
        assert len(runs) == len(set(runs)) and selection[-1]["is_last_step"]
        assert all(a[1] < b[1] for a, b in zip(order, order[1:], strict=False) if a[0] == b[0])


def _close(a, b) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, abs_tol=1e-12) for x, y in zip(a, b, strict=True)
    )


def _check_verl(rec, row):
    p, r = row["prompt_token_ids"], row["response_token_ids"]
    assert rec["prompt_ids"] == p and rec["response_ids"] == r
    assert rec["response_mask"] == [1] * len(r)
    assert _close(rec["response_logprobs"], row["response_logprobs"])
    assert rec["advantages"] == [row["advantage"]] * len(r)
    assert rec["uid"] == row["group_id"] and rec["reward_score"] == row["reward"]
    assert rec["num_turns"] == len(json.loads(row["messages"])) + 1
    return rec["multi_modal_data"]["images"]


def _check_prime_rl(rec, row):
    p, r = row["prompt_token_ids"], row["response_token_ids"]
    assert rec["token_ids"] == p + r
    assert rec["mask"] == [False] * len(p) + [True] * len(r)
    assert _close(rec["logprobs"], [0.0] * len(p) + row["response_logprobs"])
    assert rec["advantages"] == [0.0] * len(p) + [row["advantage"]] * len(r)
    assert rec["temperatures"] == [row["temperature"]] * (len(p) + len(r))
    return rec["images"]


def _check_skyrl(rec, row):
    r = row["response_token_ids"]
    assert rec["prompt_token_ids"] == row["prompt_token_ids"] and rec["response_ids"] == r
    assert rec["loss_masks"] == [1] * len(r)
    assert _close(rec["rollout_logprobs"], row["response_logprobs"])
    last = [0.0] * (len(r) - 1) + [row["reward"] if rec["is_last_step"] else 0.0]
    assert rec["rewards"] == last and rec["advantage"] == row["advantage"]
    assert rec["stop_reasons"] == row["finish_reason"]
    assert rec["trajectory_ids"] == {
        "instance_id": row["group_id"],
        "repetition_id": row["attempt"],
    }
    return rec["images"]


def _check_trl(rec, row):
    r = row["response_token_ids"]
    assert rec["prompt_ids"] == row["prompt_token_ids"] and rec["completion_ids"] == r
    assert rec["completion_mask"] == [1] * len(r)
    assert _close(rec["sampling_per_token_logps"], row["response_logprobs"])
    assert _close(rec["old_per_token_logps"], row["response_logprobs"])
    assert rec["advantages"] == row["advantage"]
    assert rec["num_images"] == len(row["image_shas"])
    return rec["images"]


CHECKS = {
    "verl": _check_verl,
    "prime-rl": _check_prime_rl,
    "skyrl": _check_skyrl,
    "trl": _check_trl,
}


@pytest.mark.parametrize("trainer", sorted(FIELDS))
def test_export_trainer_writes_the_lake_rows_in_the_trainer_fields(lake, trainer, tmp_path):
    out = tmp_path / trainer
    result = CliRunner().invoke(
        app,
        ["lake", "export-trainer", VERSION, "--format", trainer, "--out", str(out)]
        + ["--lake", str(lake.root)],
    )
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "rows of incomplete groups" in said and "with invalid logprobs" in said

    records = pq.read_table(out / f"{trainer}.parquet").to_pylist()
    every = _lake_rows(lake)
    want = {k for k, r in every.items() if r["group_complete"] and r["logprobs_valid"]}
    assert {(r["rollout_id"], r["step"]) for r in records} == want
    multi = 0
    for rec in records:
        assert FIELDS[trainer] <= set(rec), set(FIELDS[trainer]) - set(rec)
        row = every[(rec["rollout_id"], rec["step"])]
        for key in ("policy_version", "model_files_root", *IDENTITY_KEYS):
            assert rec[key] == row[key], key
        images = CHECKS[trainer](rec, row)
        # every turn's screenshots, in the prompt's placeholder order, as files of the export
        assert images == [f"images/{sha}.png" for sha in row["image_shas"]]
        for path, sha in zip(images, row["image_shas"], strict=True):
            assert (out / path).read_bytes() == (
                lake.run_dir(VERSION) / "images" / f"{sha}.png"
            ).read_bytes()
        multi += len(images) > 1
    assert multi, "multi-turn rows carry more than one screenshot"
    # the records name their model files as rows do: a trainer's check reads them (the scripted
    # server's root is no folder, so nothing says which tokenizer made the ids)
    processor = SimpleNamespace(chat_template=None, tokenizer=SimpleNamespace(name_or_path=None))
    with pytest.raises(ModelFilesError, match="tokenizer_sha256 is null.*scripted-qwen"):
        check_model_files(records, processor)


def test_cli_includes_what_it_is_asked_to(lake, tmp_path):
    result = CliRunner().invoke(
        app,
        ["lake", "export-trainer", VERSION, "--format", "trl", "--out", str(tmp_path)]
        + ["--lake", str(lake.root), "--include-incomplete", "--include-invalid-logprobs"],
    )
    assert result.exit_code == 0, result.output
    records = pq.read_table(tmp_path / "trl.parquet").to_pylist()
    assert len(records) == len(_lake_rows(lake))
    assert any(r["advantages"] is None for r in records)  # the incomplete group's
    bad = CliRunner().invoke(
        app,
        ["lake", "export-trainer", VERSION, "--format", "openrlhf", "--out", str(tmp_path)]
        + ["--lake", str(lake.root)],
    )
    assert bad.exit_code != 0 and "verl, prime-rl, skyrl, trl" in bad.output


def test_batches_have_the_trainers_shapes_and_the_rows_values(lake):
    from legato_pipelines.trainer.formats import to_skyrl, to_trl, to_verl

    rows, _ = training_rows(lake, VERSION)
    rows = rows[:5]
    prompt = max(len(r["prompt_token_ids"]) for r in rows)
    response = max(len(r["response_token_ids"]) for r in rows)

    batch = verl_batch([to_verl(r) for r in rows], pad_token_id=-1, response_length=response + 3)
    width = response + 3
    assert batch["prompts"].shape == (5, prompt) and batch["responses"].shape == (5, width)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert batch[key].shape == (5, prompt + width), key
    for key in ("response_mask", "rollout_log_probs", "advantages"):
        assert batch[key].shape == (5, width), key
    for i, row in enumerate(rows):
        p, r = row["prompt_token_ids"], row["response_token_ids"]
        assert batch["prompts"][i, prompt - len(p) :].tolist() == p  # left padding
        assert batch["responses"][i, : len(r)].tolist() == r  # right padding
        assert batch["attention_mask"][i].sum() == len(p) + len(r)
        ids = batch["input_ids"][i][batch["attention_mask"][i] == 1].tolist()
        assert ids == p + r
        assert batch["response_mask"][i].tolist() == [1] * len(r) + [0] * (width - len(r))
        np.testing.assert_allclose(
            batch["rollout_log_probs"][i, : len(r)], row["response_logprobs"], atol=1e-6
        )
        np.testing.assert_allclose(batch["advantages"][i, : len(r)], row["advantage"], atol=1e-6)
        real = batch["position_ids"][i][batch["attention_mask"][i] == 1]
        assert real.tolist() == list(range(len(p) + len(r)))
    assert list(batch["uid"]) == [r["group_id"] for r in rows]

    trl = trl_batch([to_trl(r) for r in rows], pad_token_id=0)
    assert trl["prompt_ids"].shape == trl["prompt_mask"].shape == (5, prompt)
    for key in ("completion_ids", "completion_mask", "sampling_per_token_logps"):
        assert trl[key].shape == (5, response), key
    assert trl["advantages"].shape == (5,) and trl["num_images"].shape == (5,)
    for i, row in enumerate(rows):
        mask = trl["completion_mask"][i] == 1
        assert trl["completion_ids"][i][mask].tolist() == row["response_token_ids"]
        assert trl["prompt_ids"][i][trl["prompt_mask"][i] == 1].tolist() == row["prompt_token_ids"]
        np.testing.assert_allclose(
            trl["old_per_token_logps"][i][mask], row["response_logprobs"], atol=1e-6
        )
        assert trl["advantages"][i] == pytest.approx(row["advantage"])

    out = skyrl_generator_output([to_skyrl(r) for r in rows])
    assert set(out) == set(SKYRL_KEYS) and all(len(v) == 5 for v in out.values())
    assert out["response_ids"] == [r["response_token_ids"] for r in rows]
    assert out["is_last_step"] == [r["is_last_step"] for r in rows]


def test_an_unknown_version_or_nothing_to_train_on_says_so(lake, tmp_path):
    from legato_pipelines.trainer.formats import export_trainer

    with pytest.raises(FileNotFoundError, match="step-9"):
        export_trainer(lake, "step-9", "verl", tmp_path / "out")
    # a version whose rows are all in incomplete groups: the CLI says why nothing is written
    partial = Lake(tmp_path / "partial")
    table = read_samples(lake, [VERSION], ds.field("group_complete") == False)  # noqa: E712
    assert table.num_rows
    partial.write("samples", VERSION, table)
    result = CliRunner().invoke(
        app,
        ["lake", "export-trainer", VERSION, "--format", "skyrl", "--out", str(tmp_path / "out")]
        + ["--lake", str(partial.root)],
    )
    assert result.exit_code != 0
    said = " ".join(result.output.split())
    invalid = sum(r["logprobs_valid"] is not True for r in table.to_pylist())
    assert f"{table.num_rows - invalid} in incomplete groups" in said
    assert f"{invalid} with invalid logprobs" in said and "--include-incomplete" in said
    assert not (tmp_path / "out").exists()
