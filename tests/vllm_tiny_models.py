"""Tiny random-weight vision-language models for the real-vLLM tests, built at test time.

Run with the vLLM venv's interpreter (it has torch, transformers, tokenizers, safetensors; the
project's own environment need not)::

    python tests/vllm_tiny_models.py OUT_DIR --arch qwen2_5_vl|qwen3_vl [--lora-of MODEL_DIR]

writes into ``OUT_DIR``:

* random weights (seeded) in the Qwen2.5-VL or Qwen3-VL architecture, built from transformers'
  own config classes with tiny sizes (2 layers, hidden 64, a 1-layer vision tower);
* a byte-level BPE tokenizer trained here (``tokenizers``) on a small text, with Qwen's special
  tokens (``<|im_start|>``, ``<|im_end|>``, ``<|vision_start|>``, ``<|image_pad|>``,
  ``<|vision_end|>``, ``<tool_call>``, ``<think>``...) and Qwen's chat template (images as
  ``<|vision_start|><|image_pad|><|vision_end|>``, tools as Qwen2.5's ``<tools>`` block);
* the processor configs (``preprocessor_config.json`` for ``Qwen2VLImageProcessor``, and for
  Qwen3-VL the video processor's), with a small ``max_pixels`` so screenshots cost few tokens.

``--lora-of MODEL_DIR`` instead writes a PEFT-format LoRA adapter for that model
(``adapter_config.json`` + ``adapter_model.safetensors``, rank 8 on the language model's
attention projections, non-zero random A and B so it changes the logprobs); ``--seed`` picks
the weights (two seeds: two different checkpoints of the same shape).

Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set before transformers is imported.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HIDDEN = 64
LAYERS = 2
HEADS = 2  # head_dim 32: the smallest vLLM-CPU attention supports
KV_HEADS = 1
VOCAB = 1024  # >= the trained tokenizer's size (BPE vocab + special tokens)
MAX_POSITIONS = 8192
VISION = {  # a 1-layer vision tower; each architecture adds its own keys
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": HIDDEN,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Qwen's non-special added tokens (they appear in the decoded text, as the parsers expect)
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}"
    "{% if messages[0]['content'] is string %}{{ messages[0]['content'] }}"
    "{% else %}{% for c in messages[0]['content'] %}{% if 'text' in c %}{{ c['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{% else %}You are a helpful assistant.{% endif %}"
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{% endif %}"
    "{% set image_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% else %}"
    "{% if loop.first and message['role'] != 'system' and not tools %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is not none %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message.tool_calls %}{% for tc in message.tool_calls %}"
    '\n<tool_call>\n{"name": "{{ tc.function.name }}", "arguments": '
    "{{ tc.function.arguments if tc.function.arguments is string "
    "else tc.function.arguments | tojson }}}\n</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TRAINING_TEXT = """\
You are a computer-use agent. The screenshot shows a desktop with a terminal and a text editor.
Click the button, type the text, press enter, scroll down, wait, done, fail.
<tool_call>
{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [640, 360]}}
</tool_call>
{"action": "type", "text": "hello world"} {"action": "key", "keys": ["ctrl", "s"]}
Thought: I should open the file menu and save the document. Action: click(120, 45)
The quick brown fox jumps over the lazy dog. 0123456789 ()[]{}<>:;,.!?'"-_=+*/\\|@#$%^&~`
legato probe: answer with one short sentence. Describe the first one in a few words.
"""


def build_tokenizer(out: Path) -> dict[str, int]:
    """Train the BPE tokenizer into ``out``; returns the special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT] * 20, trainer=trainer)
    tok.add_tokens(ADDED_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # vLLM's Qwen processors look the tokenizer class up by name: say Qwen2's
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=1))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + ADDED_TOKENS}
    assert len(tok.get_vocab()) <= VOCAB, len(tok.get_vocab())
    return ids


def _text_config(ids: dict[str, int]) -> dict:
    return {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }


def build_model(out: Path, arch: str, seed: int) -> None:
    """Random weights of ``arch`` (``qwen2_5_vl`` | ``qwen3_vl``) plus tokenizer and
    processor configs, saved in ``out`` (bfloat16)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(out)
    text = _text_config(ids)
    torch.manual_seed(seed)
    if arch == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        text["rope_scaling"] = {"type": "mrope", "mrope_section": [8, 4, 4]}
        text["rope_theta"] = 10000.0
        vision = {**VISION, "patch_size": 14, "window_size": 56, "fullatt_block_indexes": [0]}
        config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **_token_ids(ids))
        model = Qwen2_5_VLForConditionalGeneration(config)
        patch, processor = 14, "Qwen2_5_VLProcessor"
    elif arch == "qwen3_vl":
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        text["rope_scaling"] = {
            "rope_type": "default",
            "mrope_section": [8, 4, 4],
            "mrope_interleaved": True,
        }
        text["rope_theta"] = 10000.0
        vision = {
            **VISION,
            "patch_size": 16,
            "num_position_embeddings": 256,
            "deepstack_visual_indexes": [0],
        }
        config = Qwen3VLConfig(text_config=text, vision_config=vision, **_token_ids(ids))
        model = Qwen3VLForConditionalGeneration(config)
        patch, processor = 16, "Qwen3VLProcessor"
    else:
        raise SystemExit(f"--arch must be qwen2_5_vl or qwen3_vl, got {arch!r}")
    with torch.no_grad():
        for param in model.parameters():  # larger than the default init: peaked logprobs
            param.normal_(0.0, 0.5 if param.dim() > 1 else 0.1)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]})
    )
    pixels = {"min_pixels": (patch * 2) ** 2, "max_pixels": (patch * 2) ** 2 * 64}
    image = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor,
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "rescale_factor": 1 / 255,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "patch_size": patch,
        "temporal_patch_size": 2,
        "merge_size": 2,
        **pixels,
        "size": {"shortest_edge": pixels["min_pixels"], "longest_edge": pixels["max_pixels"]},
    }
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=1))
    if arch == "qwen3_vl":
        video = {**image, "video_processor_type": "Qwen3VLVideoProcessor", "fps": 2}
        del video["image_processor_type"]
        (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=1))


def _token_ids(ids: dict[str, int]) -> dict[str, int]:
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


def adapter_config(base: Path, rank: int, alpha: int, targets: list[str]) -> dict:
    """PEFT's ``adapter_config.json`` for a plain LoRA (no dropout, bias, DoRA or rsLoRA) of
    rank ``rank`` and scale ``alpha / rank`` on the modules named ``targets``."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(targets),
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }


def build_lora(out: Path, base: Path, seed: int, rank: int = 8) -> None:
    """A PEFT-format LoRA adapter for the model in ``base``: ``q_proj``/``v_proj`` of every
    language-model layer, A and B random (seeded), bfloat16."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((base / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    head_dim = text.get("head_dim") or hidden // heads
    kv = text["num_key_value_heads"] * head_dim
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(text["num_hidden_layers"]):
        for name, width in (("q_proj", heads * head_dim), ("v_proj", kv)):
            prefix = f"base_model.model.model.language_model.layers.{layer}.self_attn.{name}"
            a = torch.randn(rank, hidden, generator=gen) * 0.5
            b = torch.randn(width, rank, generator=gen) * 0.5
            tensors[f"{prefix}.lora_A.weight"] = a.to(torch.bfloat16).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.to(torch.bfloat16).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = adapter_config(base, rank, 2 * rank, ["q_proj", "v_proj"])
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", default="qwen2_5_vl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora-of", type=Path, default=None)
    args = parser.parse_args()
    if args.lora_of is not None:
        build_lora(args.out, args.lora_of, args.seed)
    else:
        build_model(args.out, args.arch, args.seed)


if __name__ == "__main__":
    main()
