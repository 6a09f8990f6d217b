"""One GRPO-style trainer step on LoRA parameters, in plain PyTorch (no peft, no trainer library).

Run with an interpreter that has torch and transformers (the vLLM venv's)::

    python examples/closed_loop/trainer_step.py init --base BASE --out CKPT --merged MERGED
    python examples/closed_loop/trainer_step.py step --base BASE --prev CKPT_N --rows ROWS.jsonl \
        --images IMAGES --out CKPT_N+1 --merged MERGED_N+1

``init`` writes the first adapter (seeded random A and B); ``step`` reads version N's sample
rows (JSONL of ``samples`` rows, ``legato_pipelines.store.read_samples``), rebuilds each row's
exact model inputs (:func:`legato_pipelines.trainer.inputs.model_inputs`), and takes one Adam
step on the LoRA matrices of ``prev``:

* LoRA by hand: every language-model ``q_proj``/``v_proj`` (``nn.Linear``, frozen) becomes
  ``W x + (alpha / r) * B (A x)``; A ``[r, in]`` and B ``[out, r]`` are the only parameters;
* the loss, on response tokens only (the rows' loss mask), is the PPO/GRPO clipped surrogate
  ``-min(rho * adv, clip(rho, 1 - eps, 1 + eps) * adv)`` with ``rho = exp(logp - old_logp)``
  (the server's stored logprobs) and the group advantage of the row (lake column
  ``advantage``), minus ``entropy_coef`` times the token entropy; averaged over all response
  tokens of the version. Rows without an advantage (an incomplete group) or with invalid
  logprobs are skipped. With rewards all equal every advantage is 0 and only the entropy term
  moves the weights: the step still writes new weights (the loop checks the plumbing);
* written: ``out`` in PEFT's adapter format (``adapter_config.json`` +
  ``adapter_model.safetensors``, float32; what vLLM's ``/v1/load_lora_adapter`` loads), built
  in ``out``'s sibling ``.tmp-<name>`` and renamed into place (a sensor never sees half a
  folder), and ``merged``: the full weights ``W + (alpha / r) B A`` in float32 with the base's
  tokenizer and processor files (the gap check's model: it takes full weights, not an adapter).

Prints one JSON object: rows and tokens used, loss, mean ratio, entropy, the L2 norm of the
update, and the folders.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "config.json")


def lora_modules(model) -> dict[str, object]:
    """``{peft key prefix: nn.Linear}`` of the language model's attention projections
    (:data:`TARGETS`); the prefix is the one vLLM and PEFT use
    (``base_model.model.model.language_model.layers.<i>.self_attn.<proj>``)."""
    out = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in TARGETS and ".language_model.layers." in f".{name}":
            out[f"base_model.model.{name}"] = module
    if not out:
        raise SystemExit("no language-model q_proj/v_proj found: not a Qwen-VL model?")
    return out


class LoRALinear:
    """Wraps a frozen ``nn.Linear``: ``forward(x) = linear(x) + scale * (x @ A.T) @ B.T``."""

    @staticmethod
    def wrap(linear, a, b, scale):
        import torch

        class _LoRA(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.base = linear
                self.lora_A = torch.nn.Parameter(a.clone().float())
                self.lora_B = torch.nn.Parameter(b.clone().float())
                self.scale = scale

            def forward(self, x):
                return self.base(x) + self.scale * ((x @ self.lora_A.T) @ self.lora_B.T)

        return _LoRA()


def _set_module(model, name: str, module) -> None:
    parent_name, leaf = name.rsplit(".", 1)
    setattr(model.get_submodule(parent_name), leaf, module)


def load_base(base: Path):
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def attach(model, adapter: dict | None, seed: int):
    """Wrap every target with LoRA; ``adapter``'s tensors (PEFT keys) or seeded random ones.
    Returns ``{peft prefix: wrapped module}``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    wrapped = {}
    for prefix, linear in lora_modules(model).items():
        if adapter is not None:
            a = adapter[f"{prefix}.lora_A.weight"]
            b = adapter[f"{prefix}.lora_B.weight"]
        else:
            a = torch.randn(RANK, linear.in_features, generator=gen) * 0.3
            b = torch.randn(linear.out_features, RANK, generator=gen) * 0.3
        module = LoRALinear.wrap(linear, a, b, ALPHA / RANK)
        _set_module(model, prefix.removeprefix("base_model.model."), module)
        wrapped[prefix] = module
    return wrapped


def save(model, wrapped: dict, base: Path, out: Path, merged: Path) -> None:
    """The adapter (PEFT format, built aside then renamed into ``out``) and the merged full
    weights in ``merged`` (module doc)."""
    import torch
    from safetensors.torch import save_file

    from tests.vllm_tiny_models import adapter_config

    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {}
    for prefix, module in wrapped.items():
        tensors[f"{prefix}.lora_A.weight"] = module.lora_A.detach().float().contiguous()
        tensors[f"{prefix}.lora_B.weight"] = module.lora_B.detach().float().contiguous()
    save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = adapter_config(base, RANK, ALPHA, list(TARGETS))
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=1))
    if out.exists():
        raise SystemExit(f"{out} exists already: a checkpoint folder is written once")
    os.rename(tmp, out)

    with torch.no_grad():
        for prefix, module in wrapped.items():
            module.base.weight += module.scale * (module.lora_B @ module.lora_A)
            _set_module(model, prefix.removeprefix("base_model.model."), module.base)
    shutil.rmtree(merged, ignore_errors=True)
    model.save_pretrained(merged, safe_serialization=True)
    for path in base.iterdir():  # tokenizer, template, processor: byte-identical to the served
        if path.is_file() and path.name not in WEIGHT_FILES and not (merged / path.name).exists():
            shutil.copy2(path, merged / path.name)
    for name in ("tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json"):
        if (base / name).exists():
            shutil.copy2(base / name, merged / name)


def step(args) -> dict:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoProcessor

    from legato_pipelines.trainer.inputs import forward_kwargs, model_inputs

    torch.manual_seed(args.seed)
    model = load_base(args.base)
    wrapped = attach(model, load_file(str(args.prev / "adapter_model.safetensors")), args.seed)
    before = {k: (m.lora_A.detach().clone(), m.lora_B.detach().clone()) for k, m in wrapped.items()}
    processor = AutoProcessor.from_pretrained(str(args.base))
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    params = [p for m in wrapped.values() for p in (m.lora_A, m.lora_B)]
    optimizer = torch.optim.Adam(params, lr=args.lr)
    tokens = sum(len(r["response_token_ids"] or []) for r in rows)
    used = skipped = 0
    total_loss = total_entropy = ratio_sum = 0.0
    counted = 0
    model.train()
    optimizer.zero_grad()
    for row in rows:
        if not row.get("logprobs_valid") or row.get("advantage") is None:
            skipped += 1
            continue
        inputs = model_inputs(row, processor, args.images, model_files=args.base)
        logits = model(**forward_kwargs(inputs)).logits[0].float()
        start = inputs["prompt_length"]
        ids = inputs["input_ids"][0]
        logp_all = torch.log_softmax(logits[start - 1 : ids.shape[0] - 1], dim=-1)
        logp = logp_all.gather(-1, ids[start:, None])[:, 0]
        old = inputs["old_logprobs"][0, start:]
        mask = inputs["loss_mask"][0, start:] & ~torch.isnan(old)
        adv = float(inputs["advantage"][0])
        ratio = torch.exp(logp - torch.nan_to_num(old))
        clipped = torch.clamp(ratio, 1 - args.clip, 1 + args.clip)
        surrogate = -torch.minimum(ratio * adv, clipped * adv)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        per_token = surrogate - args.entropy_coef * entropy
        loss = (per_token * mask).sum() / max(tokens, 1)
        loss.backward()
        total_loss += float(loss)
        total_entropy += float((entropy * mask).sum())
        ratio_sum += float((ratio.detach() * mask).sum())
        counted += int(mask.sum())
        used += 1
    if used == 0:
        raise SystemExit(
            f"no usable row in {args.rows} ({len(rows)} rows, none with valid "
            "logprobs and an advantage)"
        )
    optimizer.step()
    update = math.sqrt(
        sum(
            float(((m.lora_A - before[k][0]) ** 2).sum() + ((m.lora_B - before[k][1]) ** 2).sum())
            for k, m in wrapped.items()
        )
    )
    model.eval()
    save(model, wrapped, args.base, args.out, args.merged)
    return {
        "rows": len(rows),
        "rows_used": used,
        "rows_skipped": skipped,
        "tokens": counted,
        "loss": total_loss,
        "mean_ratio": ratio_sum / max(counted, 1),
        "mean_entropy": total_entropy / max(counted, 1),
        "update_l2": update,
        "adapter": str(args.out),
        "merged": str(args.merged),
    }


def init(args) -> dict:
    model = load_base(args.base)
    wrapped = attach(model, None, args.seed)
    save(model, wrapped, args.base, args.out, args.merged)
    return {"adapter": str(args.out), "merged": str(args.merged), "seed": args.seed}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("init", "step"))
    parser.add_argument("--base", type=Path, required=True, help="the served base model folder")
    parser.add_argument("--out", type=Path, required=True, help="the new adapter folder")
    parser.add_argument("--merged", type=Path, required=True, help="full weights for the gap check")
    parser.add_argument("--prev", type=Path, help="step: the adapter of the version trained on")
    parser.add_argument("--rows", type=Path, help="step: that version's sample rows (JSONL)")
    parser.add_argument("--images", type=Path, help="step: the version's screenshots folder")
    parser.add_argument("--lr", type=float, default=2e-2, help="Adam learning rate")
    parser.add_argument("--clip", type=float, default=0.2, help="PPO clip epsilon")
    parser.add_argument("--entropy-coef", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.mode == "step" and not (args.prev and args.rows and args.images):
        parser.error("step needs --prev, --rows and --images")
    report = init(args) if args.mode == "init" else step(args)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
