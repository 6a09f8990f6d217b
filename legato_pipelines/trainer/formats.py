"""A partition's samples in the shapes verl, prime-rl, SkyRL and TRL take (docs/trainer.md §5).

There is no common format for multi-turn VLM RL samples: each trainer has its own record.
One lake ``samples`` row (one model call of an attempt: the prompt as the server tokenized it,
the screenshots of that prompt in placeholder order, the response ids and their logprobs,
the group's advantage) becomes one record of the trainer's:

=============  =====================================================================
``verl``       one agent-loop output (``AgentLoopOutput``: ``prompt_ids``,
               ``response_ids``, ``response_mask``, ``response_logprobs``,
               ``multi_modal_data``, ``reward_score``, ``num_turns``) plus ``uid`` and
               token-level ``advantages``; :func:`verl_batch` pads records into the
               ``DataProto`` batch (``prompts``, ``responses``, ``input_ids``, ...)
``prime-rl``   one ``TrainingSample``: flat ``token_ids`` with a trainable ``mask``,
               ``logprobs``, ``temperatures`` and ``advantages`` over the whole sequence
``skyrl``      one entry of a ``GeneratorOutput`` (step-wise): ``prompt_token_ids``,
               ``response_ids``, ``rewards``, ``loss_masks``, ``rollout_logprobs``,
               ``stop_reasons``, ``trajectory_ids``, ``is_last_step``;
               :func:`skyrl_generator_output` makes the column-wise dict
``trl``        one row of ``GRPOTrainer``'s generated batch: ``prompt_ids``,
               ``completion_ids``, ``completion_mask``, ``advantages``,
               ``sampling_per_token_logps``, ``old_per_token_logps``, ``num_images``;
               :func:`trl_batch` pads records as the trainer does
=============  =====================================================================

Every record also names its screenshots, in placeholder order, as ``images``: paths relative
to the export folder (``images/<sha>.png``). Pixel values, ``image_grid_thw`` and
``mm_token_type_ids`` are not stored: they are rebuilt from those files by the served model's
processor (:func:`legato_pipelines.trainer.inputs.model_inputs`), which also checks that
the prompt's placeholders fit the images. Records are plain Python lists and numbers; the
``*_batch`` helpers return NumPy arrays. Nothing here imports torch.

:func:`training_rows` is the selection: by default only rows with ``logprobs_valid`` and a
``group_complete`` advantage (``include_incomplete`` / ``include_invalid`` widen it).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import LegatoError
from ..model_files import IDENTITY_KEYS

IMAGES_DIR = "images"


def training_rows(
    lake: Any,
    version: str,
    *,
    include_incomplete: bool = False,
    include_invalid: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The ``samples`` rows of ``version`` worth training on, in (rollout, step) order, and
    what was left out.

    ``lake``: a root, URL or :class:`~legato_pipelines.store.lake.Lake`. Left out by default:
    rows whose group is short of attempts (``group_complete`` not true: their ``advantage`` is
    null, a mean over part of a group means nothing) and rows whose logprobs are not valid
    (``logprobs_valid`` not true: a sentinel, a length mismatch, a release that did not check).
    Rows come grouped by attempt, steps in order; each gains ``is_last_step``: it is the last
    of its attempt's rows kept (so an attempt whose last call was left out still has one, which
    carries its reward for SkyRL). Raises ``FileNotFoundError`` for a version the lake
    does not hold."""
    from ..store.lake import Lake, read_samples

    store = lake if isinstance(lake, Lake) else Lake(lake)
    rows = sorted(
        read_samples(store, [version]).to_pylist(),
        key=lambda r: (
            str(r.get("group_id")),
            int(r.get("attempt") or 0),
            str(r.get("rollout_id")),
            int(r["step"]),
        ),
    )
    kept: list[dict[str, Any]] = []
    dropped = {"incomplete_group": 0, "invalid_logprobs": 0}
    for row in rows:
        if row.get("logprobs_valid") is not True and not include_invalid:
            dropped["invalid_logprobs"] += 1
        elif row.get("group_complete") is not True and not include_incomplete:
            dropped["incomplete_group"] += 1
        else:
            kept.append(row)
    last: dict[str, int] = {}
    for row in kept:
        last[row["rollout_id"]] = max(last.get(row["rollout_id"], -1), int(row["step"]))
    for row in kept:
        row["is_last_step"] = int(row["step"]) == last[row["rollout_id"]]
    return kept, dropped


def _ids(row: Mapping[str, Any], column: str) -> list[int]:
    values = row.get(column)
    if not values:
        raise LegatoError(
            f"row {row.get('rollout_id')} step {row.get('step')}: {column} is empty; a trainer "
            "needs the server's ids (fix: collect from a server that returns token ids, e.g. "
            "vLLM >= 0.10.2)"
        )
    return [int(t) for t in values]


def _logprobs(row: Mapping[str, Any], length: int) -> list[float | None]:
    values = list(row.get("response_logprobs") or [])
    if len(values) != length:
        raise LegatoError(
            f"row {row.get('rollout_id')} step {row.get('step')}: {len(values)} "
            f"response_logprobs for {length} response_token_ids (fix: keep rows WHERE "
            "logprobs_valid, the default)"
        )
    return [None if v is None else float(v) for v in values]


def _advantage(row: Mapping[str, Any]) -> float | None:
    value = row.get("advantage")
    return None if value is None else float(value)


def _images(row: Mapping[str, Any]) -> list[str]:
    return [f"{IMAGES_DIR}/{sha}.png" for sha in row.get("image_shas") or []]


def _lineage(row: Mapping[str, Any]) -> dict[str, Any]:
    """Columns every record keeps: the way back to its lake row, and the model files that made
    its ids (a trainer refuses records of other files:
    :func:`~legato_pipelines.trainer.inputs.check_model_files` takes records as rows)."""
    return {
        "rollout_id": row.get("rollout_id"),
        "step": int(row["step"]),
        "policy_version": row.get("policy_version"),
        "model_files_root": row.get("model_files_root"),
        **{key: row.get(key) for key in IDENTITY_KEYS},
    }


def _turns(row: Mapping[str, Any]) -> int:
    messages = row.get("messages")
    return (len(json.loads(messages)) if messages else 0) + 1  # the prompt's, then the answer


def to_verl(row: Mapping[str, Any]) -> dict[str, Any]:
    """One row as verl's agent-loop output (``AgentLoopOutput``) plus what its GRPO step
    reads from the batch: ``uid`` (the group, ``non_tensor_batch["uid"]``) and ``advantages``
    (the row's advantage on each response token; null for a row without one)."""
    prompt, response = _ids(row, "prompt_token_ids"), _ids(row, "response_token_ids")
    advantage = _advantage(row)
    return {
        "prompt_ids": prompt,
        "response_ids": response,
        "response_mask": [1] * len(response),
        "response_logprobs": _logprobs(row, len(response)),
        "multi_modal_data": {"images": _images(row)},
        "reward_score": row.get("reward"),
        "num_turns": _turns(row),
        "uid": row.get("group_id"),
        "advantages": None if advantage is None else [advantage] * len(response),
        **_lineage(row),
    }


def to_prime_rl(row: Mapping[str, Any], env_name: str | None = None) -> dict[str, Any]:
    """One row as prime-rl's ``TrainingSample``: one flat sequence (prompt then response),
    ``mask`` true on the response, and ``logprobs`` (0 on the prompt), ``temperatures`` (the
    row's sampling temperature) and ``advantages`` (0 on the prompt) over every token.
    ``env_name``: default the row's ``task_set``."""
    prompt, response = _ids(row, "prompt_token_ids"), _ids(row, "response_token_ids")
    advantage = _advantage(row)
    temperature = row.get("temperature")
    length = len(prompt) + len(response)
    return {
        "token_ids": prompt + response,
        "mask": [False] * len(prompt) + [True] * len(response),
        "logprobs": [0.0] * len(prompt) + _logprobs(row, len(response)),
        "temperatures": [1.0 if temperature is None else float(temperature)] * length,
        "env_name": env_name or row.get("task_set") or "legato",
        "advantages": None
        if advantage is None
        else [0.0] * len(prompt) + [advantage] * len(response),
        "images": _images(row),
        **_lineage(row),
    }


def to_skyrl(row: Mapping[str, Any]) -> dict[str, Any]:
    """One row as one entry of SkyRL's step-wise ``GeneratorOutput`` (one entry per model
    call, an attempt's calls in order, ``is_last_step`` on its last). ``rewards`` is per token:
    the attempt's reward on the last token of its last step, 0 elsewhere (SkyRL computes its
    advantages on last steps, grouped by ``trajectory_ids[i].instance_id``, and broadcasts them
    to the attempt's steps); legato's ``advantage`` rides along for checking."""
    prompt, response = _ids(row, "prompt_token_ids"), _ids(row, "response_token_ids")
    rewards = [0.0] * len(response)
    if row.get("is_last_step") and row.get("reward") is not None:
        rewards[-1] = float(row["reward"])
    return {
        "prompt_token_ids": prompt,
        "response_ids": response,
        "rewards": rewards,
        "loss_masks": [1] * len(response),
        "rollout_logprobs": _logprobs(row, len(response)),
        "stop_reasons": row.get("finish_reason"),
        "trajectory_ids": {
            "instance_id": row.get("group_id"),
            "repetition_id": int(row.get("attempt") or 0),
        },
        "is_last_step": bool(row.get("is_last_step")),
        "advantage": _advantage(row),
        "images": _images(row),
        **_lineage(row),
    }


def to_trl(row: Mapping[str, Any]) -> dict[str, Any]:
    """One row as one row of TRL ``GRPOTrainer``'s generated batch (unpadded):
    ``sampling_per_token_logps`` are the server's logprobs, and ``old_per_token_logps`` the
    same (the policy that sampled is the old policy; TRL recomputes them with its own model
    when it generates itself). ``advantages`` is the row's scalar."""
    prompt, response = _ids(row, "prompt_token_ids"), _ids(row, "response_token_ids")
    logprobs = _logprobs(row, len(response))
    images = _images(row)
    return {
        "prompt_ids": prompt,
        "completion_ids": response,
        "completion_mask": [1] * len(response),
        "advantages": _advantage(row),
        "sampling_per_token_logps": logprobs,
        "old_per_token_logps": list(logprobs),
        "num_images": len(images),
        "images": images,
        "reward": row.get("reward"),
        **_lineage(row),
    }


CONVERTERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "verl": to_verl,
    "prime-rl": to_prime_rl,
    "skyrl": to_skyrl,
    "trl": to_trl,
}
"""Format name (``legato lake export-trainer --format``) -> row converter."""


def _pad(rows: Sequence[Sequence[Any]], value: Any, side: str, width: int | None, dtype: str):
    import numpy as np

    width = max((len(r) for r in rows), default=0) if width is None else width
    out = np.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise LegatoError(f"a sequence of {len(r)} tokens does not fit a width of {width}")
        r = [value if v is None else v for v in r]
        if r:
            if side == "left":
                out[i, width - len(r) :] = r
            else:
                out[i, : len(r)] = r
    return out


def verl_batch(
    records: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    *,
    prompt_length: int | None = None,
    response_length: int | None = None,
) -> dict[str, Any]:
    """:func:`to_verl` records padded into verl's ``DataProto`` batch, as NumPy arrays: prompts
    left-padded to ``prompt_length`` (default: the longest), responses right-padded to
    ``response_length``. Keys: ``prompts`` ``[B, P]``, ``responses`` ``[B, R]``,
    ``response_mask`` ``[B, R]``, ``input_ids`` and ``attention_mask`` ``[B, P+R]``,
    ``position_ids`` ``[B, P+R]`` (1-D text positions: a Qwen-VL model needs M-RoPE
    positions from the processor's ``get_rope_index`` with the images), ``rollout_log_probs``
    and ``advantages`` ``[B, R]`` float32 (0 on padding), and non-tensor ``uid``,
    ``multi_modal_data`` (object arrays)."""
    import numpy as np

    prompts = _pad([r["prompt_ids"] for r in records], pad_token_id, "left", prompt_length, "int64")
    responses = _pad(
        [r["response_ids"] for r in records], pad_token_id, "right", response_length, "int64"
    )
    width = responses.shape[1]
    response_mask = _pad([r["response_mask"] for r in records], 0, "right", width, "int64")
    attention = np.concatenate(
        [
            _pad(
                [[1] * len(r["prompt_ids"]) for r in records], 0, "left", prompts.shape[1], "int64"
            ),
            _pad([[1] * len(r["response_ids"]) for r in records], 0, "right", width, "int64"),
        ],
        axis=1,
    )
    positions = np.clip(np.cumsum(attention, axis=1) - 1, 0, None)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention,
        "position_ids": positions,
        "rollout_log_probs": _pad(
            [r["response_logprobs"] for r in records], 0.0, "right", width, "float32"
        ),
        "advantages": _pad(
            [r["advantages"] or [] for r in records], 0.0, "right", width, "float32"
        ),
        "uid": np.array([r["uid"] for r in records], dtype=object),
        "multi_modal_data": np.array([r["multi_modal_data"] for r in records], dtype=object),
    }


def trl_batch(records: Sequence[Mapping[str, Any]], pad_token_id: int) -> dict[str, Any]:
    """:func:`to_trl` records padded as ``GRPOTrainer`` pads its generated batch (prompts on
    the left, completions on the right), as NumPy arrays: ``prompt_ids``/``prompt_mask``
    ``[B, P]``, ``completion_ids``/``completion_mask`` ``[B, C]``,
    ``sampling_per_token_logps``/``old_per_token_logps`` ``[B, C]`` float32 (0 on padding),
    ``advantages`` ``[B]`` float32 (NaN for a row without one), ``num_images`` ``[B]``."""
    import numpy as np

    prompts = [r["prompt_ids"] for r in records]
    completions = [r["completion_ids"] for r in records]
    out = {
        "prompt_ids": _pad(prompts, pad_token_id, "left", None, "int64"),
        "prompt_mask": _pad([[1] * len(p) for p in prompts], 0, "left", None, "int64"),
        "completion_ids": _pad(completions, pad_token_id, "right", None, "int64"),
        "completion_mask": _pad([r["completion_mask"] for r in records], 0, "right", None, "int64"),
    }
    for key in ("sampling_per_token_logps", "old_per_token_logps"):
        out[key] = _pad([r[key] for r in records], 0.0, "right", None, "float32")
    out["advantages"] = np.array(
        [np.nan if r["advantages"] is None else r["advantages"] for r in records], dtype="float32"
    )
    out["num_images"] = np.array([r["num_images"] for r in records], dtype="int64")
    return out


SKYRL_KEYS = (
    "prompt_token_ids",
    "response_ids",
    "rewards",
    "loss_masks",
    "rollout_logprobs",
    "stop_reasons",
    "trajectory_ids",
    "is_last_step",
)


def skyrl_generator_output(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """:func:`to_skyrl` records as SkyRL's ``GeneratorOutput`` (a dict of per-entry lists,
    :data:`SKYRL_KEYS`; ``trajectory_ids`` as ``{"instance_id", "repetition_id"}`` dicts, build
    SkyRL's ``TrajectoryID`` from them). Pixel values are not included (module doc)."""
    return {key: [r[key] for r in records] for key in SKYRL_KEYS}


def export_trainer(
    lake: Any,
    version: str,
    trainer: str,
    out: str | Path,
    *,
    include_incomplete: bool = False,
    include_invalid: bool = False,
) -> dict[str, Any]:
    """Write ``version``'s training rows in ``trainer``'s format to the folder ``out``:
    ``<out>/<trainer>.parquet`` (one record per row, :data:`CONVERTERS`) and the screenshots the
    records name under ``<out>/images/``. Returns ``{"path", "rows", "images", "excluded"}``.

    Raises :class:`~legato_pipelines.errors.LegatoError` for an unknown ``trainer`` or a
    version with no rows left to train on, ``FileNotFoundError`` for a missing version or
    screenshot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..store.lake import Lake

    if trainer not in CONVERTERS:
        raise LegatoError(f"--format {trainer!r}: one of {', '.join(CONVERTERS)}")
    store = lake if isinstance(lake, Lake) else Lake(lake)
    rows, excluded = training_rows(
        store, version, include_incomplete=include_incomplete, include_invalid=include_invalid
    )
    if not rows:
        raise LegatoError(
            f"policy_version {version!r}: no rows to train on ({excluded['incomplete_group']} in "
            f"incomplete groups, {excluded['invalid_logprobs']} with invalid logprobs excluded) "
            "(fix: --include-incomplete / --include-invalid-logprobs to see them anyway)"
        )
    records = [CONVERTERS[trainer](row) for row in rows]
    folder = Path(out)
    (folder / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
    shas = _unique(sha for row in rows for sha in row.get("image_shas") or [])
    source = store.pull_run(version) / IMAGES_DIR
    for sha in shas:
        src = source / f"{sha}.png"
        if not src.is_file():
            raise FileNotFoundError(
                f"screenshot {sha} named by policy_version {version!r} is not at {src}"
            )
        dst = folder / IMAGES_DIR / f"{sha}.png"
        if not dst.exists():
            shutil.copyfile(src, dst)
    path = folder / f"{trainer}.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    return {"path": str(path), "rows": len(records), "images": len(shas), "excluded": excluded}


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
