"""The train-inference gap of a version: the server's logprobs against a model's own.

For a sample of rows, the response logprobs are recomputed with a model the user names
(transformers, on CPU in float32 by default) from the rows' exact inputs
(:func:`~legato_pipelines.trainer.inputs.model_inputs`) and compared token by token with the
logprobs the server returned (:func:`gap_stats`):

``mean_abs_dlogp`` / ``max_abs_dlogp``  mean and max of |new - old| over response tokens
``k3_kl``         mean of ``(r - 1) - log r`` with ``r = exp(new - old)``: Schulman's k3
                  estimator of KL(server || model) from the server's own samples (>= 0)
``ratio_min`` / ``ratio_max`` / ``ratio_p05`` / ``ratio_p95`` / ``ratio_std``
                  the spread of the importance ratios ``r`` a trainer would apply

The same weights in the same precision give ~1e-6 (the tiny Qwen-VL models of the test suite
against vLLM CPU: docs/trainer.md); other weights, a wrong processor or a dropped
``mm_token_type_ids`` give 1e-1 and more.

This module runs where torch and transformers are (``python -m legato_pipelines.trainer.gap``:
the worker ``legato lake gap`` and the ``train_inference_gap`` asset check start with the
interpreter they are given); :func:`gap_stats` needs neither.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_MAX_MEAN_ABS = 0.05
"""Default threshold of ``mean_abs_dlogp``: float32 on the same weights is ~1e-6, bf16
training stacks report 1e-2 to 6e-2 (verl-omni#637); other weights are ~1."""


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def gap_stats(pairs: Iterable[tuple[float, float]]) -> dict[str, Any]:
    """Module doc's figures over ``(old, new)`` logprob pairs (natural log; a pair with a
    ``None`` or non-finite side is left out and counted in ``skipped_tokens``). Empty input
    gives ``tokens: 0`` and ``None`` figures."""
    diffs: list[float] = []
    skipped = 0
    for old, new in pairs:
        if old is None or new is None or not (math.isfinite(old) and math.isfinite(new)):
            skipped += 1
            continue
        diffs.append(new - old)
    out: dict[str, Any] = {"tokens": len(diffs), "skipped_tokens": skipped}
    if not diffs:
        return out | dict.fromkeys(
            (
                "mean_abs_dlogp",
                "max_abs_dlogp",
                "k3_kl",
                "ratio_min",
                "ratio_max",
                "ratio_p05",
                "ratio_p95",
                "ratio_std",
            )
        )
    ratios = [math.exp(min(d, 700.0)) for d in diffs]
    mean_ratio = math.fsum(ratios) / len(ratios)
    return out | {
        "mean_abs_dlogp": math.fsum(abs(d) for d in diffs) / len(diffs),
        "max_abs_dlogp": max(abs(d) for d in diffs),
        "k3_kl": math.fsum((r - 1.0) - d for r, d in zip(ratios, diffs, strict=True)) / len(diffs),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_p05": _quantile(ratios, 0.05),
        "ratio_p95": _quantile(ratios, 0.95),
        "ratio_std": math.sqrt(math.fsum((r - mean_ratio) ** 2 for r in ratios) / len(ratios)),
    }


def row_temperature(row: Mapping[str, Any]) -> float:
    """The temperature the row's logprobs are taken at: the run's for vLLM's
    ``processed_logprobs`` modes, else 1.0 (``raw_logprobs``, vLLM's default, and unknown)."""
    mode = row.get("logprobs_mode") or ""
    temperature = row.get("temperature")
    if mode.startswith("processed") and temperature:
        return float(temperature)
    return 1.0


def measure_gap(
    rows: Sequence[Mapping[str, Any]],
    model: str | Path,
    images: Any,
    *,
    processor: str | Path | None = None,
    identity: str = "require",
    dtype: str = "float32",
) -> dict[str, Any]:
    """Recompute the response logprobs of ``rows`` with the model in folder ``model`` (full
    weights, ``AutoModelForImageTextToText``) and its processor (``processor``, default the
    model's folder) and compare them with the rows' (:func:`gap_stats`); the answer also
    holds ``rows``, ``model`` and ``per_row`` (rollout, step, tokens, mean and max |dlogp|).
    Raises :class:`~legato_pipelines.errors.ModelFilesError` when the rows were made by
    other model files than the processor's (``identity``: see
    :func:`~legato_pipelines.trainer.inputs.check_model_files`)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from .inputs import check_model_files, model_inputs, response_logprobs

    proc = AutoProcessor.from_pretrained(str(processor or model))
    check_model_files(rows, proc, identity=identity, model_files=processor or model)
    net = AutoModelForImageTextToText.from_pretrained(str(model), dtype=getattr(torch, dtype))
    net.eval()
    pairs: list[tuple[float, float]] = []
    per_row = []
    for row in rows:
        inputs = model_inputs(row, proc, images, identity="skip")
        new = response_logprobs(net, inputs, row_temperature(row)).tolist()
        old = list(row["response_logprobs"])
        mine = list(zip(old, new, strict=True))
        pairs.extend(mine)
        stats = gap_stats(mine)
        per_row.append(
            {
                "rollout_id": row.get("rollout_id"),
                "step": row.get("step"),
                "tokens": stats["tokens"],
                "mean_abs_dlogp": stats["mean_abs_dlogp"],
                "max_abs_dlogp": stats["max_abs_dlogp"],
                "logprobs": new,
            }
        )
    return gap_stats(pairs) | {"rows": len(rows), "model": str(model), "per_row": per_row}


def sample_rows(rows: Sequence[Mapping[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows drawn without replacement (seeded: the same rows every time), all of them
    when there are fewer, kept in their order."""
    if n >= len(rows):
        return [dict(r) for r in rows]
    picked = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [dict(rows[i]) for i in picked]


def run_worker(
    rows: Sequence[Mapping[str, Any]],
    model: str | Path,
    images: str | Path,
    *,
    python: str | Path | None = None,
    processor: str | Path | None = None,
    identity: str = "require",
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """:func:`measure_gap` in a child process of ``python`` (default: this interpreter), the
    rows handed over as JSONL: the collector's environment need not have torch. The child
    imports this copy of legato (its folder first on ``PYTHONPATH``).

    Raises :class:`~legato_pipelines.errors.ModelFilesError` (mismatched model files: the
    child's message), :class:`~legato_pipelines.errors.ConfigError` when the child fails
    otherwise (its stderr's tail; e.g. no torch there: fix ``--python``)."""
    from ..errors import ConfigError, ModelFilesError

    interpreter = str(python or sys.executable)
    source = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.pop("LEGATO_POLICY_KEY", None)
    with tempfile.TemporaryDirectory(prefix="legato-gap-") as tmp:
        path = Path(tmp) / "rows.jsonl"
        path.write_text("".join(json.dumps(dict(r), default=str) + "\n" for r in rows))
        command = [
            interpreter, "-m", "legato_pipelines.trainer.gap",
            "--rows", str(path), "--model", str(model), "--images", str(images),
            "--identity", identity,
            *(["--processor", str(processor)] if processor else []),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, env=env, timeout=timeout, check=False
            )
        except FileNotFoundError:
            raise ConfigError(
                f"python: {interpreter!r} not found (fix: --python an interpreter with torch "
                "and transformers)"
            ) from None
    if done.returncode == 2 and "error:" in done.stderr:
        raise ModelFilesError(done.stderr.split("error:", 1)[1].strip())
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise ConfigError(
            f"the gap worker ({interpreter}) failed with exit {done.returncode}:\n{tail}\n"
            "(fix: --python an interpreter with torch and transformers, --model a full-weights "
            "folder)"
        )
    return json.loads(done.stdout)


def version_gap(
    lake: Any,
    version: str,
    model: str | Path,
    *,
    rows: int = 8,
    seed: int = 0,
    python: str | Path | None = None,
    processor: str | Path | None = None,
    identity: str = "require",
) -> dict[str, Any]:
    """The gap of ``version``'s samples in ``lake`` (root, URL or ``Lake``): ``rows`` rows
    with valid logprobs drawn with ``seed`` (:func:`sample_rows`), recomputed by
    :func:`run_worker`; adds ``version`` and ``sampled_from`` (the rows there were).
    Raises ``ConfigError`` when the version has no sample with valid logprobs."""
    import pyarrow.dataset as ds

    from ..errors import ConfigError
    from ..store.lake import Lake, read_samples

    store = lake if isinstance(lake, Lake) else Lake(lake)
    table = read_samples(store, [version], ds.field("logprobs_valid") == True)  # noqa: E712
    if table.num_rows == 0:
        raise ConfigError(
            f"version {version!r}: no samples with valid logprobs in {store.root} (fix: a "
            "version whose training_samples are materialized, `legato lake query` to list them)"
        )
    chosen = sample_rows(table.to_pylist(), rows, seed)
    images = store.pull_run(version) / "images"
    report = run_worker(
        chosen, model, images, python=python, processor=processor, identity=identity
    )
    return report | {"version": version, "sampled_from": table.num_rows}


def main(argv: Sequence[str] | None = None) -> int:
    """The worker: ``python -m legato_pipelines.trainer.gap --rows ROWS.jsonl --model DIR
    --images DIR [--processor DIR] [--identity require|if-known|skip]``; prints
    :func:`measure_gap`'s answer as one JSON object. Exit 2 with the message on stderr for a
    :class:`~legato_pipelines.errors.ModelFilesError`."""
    from ..errors import ModelFilesError

    parser = argparse.ArgumentParser(prog="python -m legato_pipelines.trainer.gap")
    parser.add_argument("--rows", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--images", required=True)
    parser.add_argument("--processor", default=None)
    parser.add_argument("--identity", default="require")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    try:
        report = measure_gap(
            rows,
            args.model,
            args.images,
            processor=args.processor,
            identity=args.identity,
            dtype=args.dtype,
        )
    except ModelFilesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.exit(main())
