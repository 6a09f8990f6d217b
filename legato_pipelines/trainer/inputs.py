"""Exact model inputs from a sample row (docs/trainer.md).

A ``samples`` row (``legato export``, :func:`legato_pipelines.store.lake.read_samples`) holds
what the server saw and answered: ``prompt_token_ids`` (the prompt as the server tokenized
it, image placeholders already expanded), the screenshots in placeholder order
(``image_shas``; PNGs in the run directory's ``images/``), ``response_token_ids``,
``response_logprobs`` and the group's ``advantage``. :func:`model_inputs` turns one row plus
the Hugging Face processor of the served model into the tensors a Qwen-VL style model takes:

``input_ids``          ``[1, L]`` prompt ids then response ids (L = P + R)
``attention_mask``     ``[1, L]`` ones
``mm_token_type_ids``  ``[1, L]`` 0 text, 1 image placeholder, 2 video (the processor's own
                       rule). Qwen2.5-VL/Qwen3-VL compute their 3-D (M-RoPE) positions from
                       it; without it transformers silently uses 1-D positions and every
                       logprob after the first image is off (measured: mean |dlogp| 0.117)
``pixel_values``       ``[patches, C*T*p*p]`` the image processor's output for the screenshots in
                       order (absent without images)
``image_grid_thw``     ``[images, 3]`` (absent without images)
``loss_mask``          ``[1, L]`` bool, true on the R response tokens only
``old_logprobs``       ``[1, L]`` float32, the server's logprob of the token at each position
                       (0 on the prompt, NaN where the server's was a sentinel)
``advantage``          ``[1]`` float32, NaN for a row without one (an incomplete group)

plus ``prompt_length`` (P), ``images`` (the PIL images, in order) and ``row`` (the input row).
:data:`MODEL_KEYS` are what the model's ``forward`` takes.

Before building anything the row's model files (``tokenizer_sha256``,
``chat_template_sha256``, ``processor_sha256``: :mod:`legato_pipelines.model_files`) are
checked against the processor's (:func:`check_model_files`), and the prompt's placeholder runs
against the screenshots' grids: a run of ``grid_t*grid_h*grid_w / merge_size**2``
placeholders per image, as many runs as images. A mismatch raises
:class:`~legato_pipelines.errors.ModelFilesError` naming what differs: pixel values computed
with other settings than the server's would silently give other logprobs.

torch, transformers and Pillow are imported when a function is called, never on import.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ..errors import ModelFilesError
from ..model_files import IDENTITY_KEYS, files_identity, template_sha256

MODEL_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")
"""The keys of :func:`model_inputs`' answer a Qwen-VL model's ``forward`` takes."""

Identity = Literal["require", "if-known", "skip"]
ImageSource = str | Path | Callable[[str], bytes]
"""Where the screenshots are: a folder of ``<sha>.png`` (a run directory's ``images/``), or a
function ``sha -> PNG bytes``."""


def processor_identity(processor: Any, model_files: str | Path | None = None) -> dict[str, Any]:
    """The model files a processor stands for: :func:`~legato_pipelines.model_files.files_identity`
    of ``model_files`` (default: the folder the processor's tokenizer was loaded from,
    ``tokenizer.name_or_path``), with the chat template hashed from the processor itself (an
    edited template counts). Tokenizer and processor hashes are ``None`` when no folder is
    known (a processor built in memory, or from a hub id)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    folder = model_files or getattr(tokenizer, "name_or_path", None)
    out: dict[str, Any] = {"root": None, **dict.fromkeys(IDENTITY_KEYS)}
    if folder and Path(folder).is_dir():
        out.update(files_identity(folder))
    template = getattr(processor, "chat_template", None) or getattr(
        tokenizer, "chat_template", None
    )
    out["chat_template_sha256"] = template_sha256(template)
    return out


def check_model_files(
    rows: Iterable[Mapping[str, Any]],
    processor: Any,
    *,
    identity: Identity = "require",
    model_files: str | Path | None = None,
) -> None:
    """Refuse rows made by other model files than ``processor``'s (module doc).

    ``identity``: ``"require"`` (default) also refuses rows that name no tokenizer (a run
    from before the columns existed, or a server whose folder was not readable by the
    collector); ``"if-known"`` compares what rows name; ``"skip"`` checks nothing.
    ``model_files``: the folder the processor came from when its tokenizer does not say.
    Raises :class:`~legato_pipelines.errors.ModelFilesError` naming the column, both hashes
    and the folders."""
    if identity == "skip":
        return
    if identity not in ("require", "if-known"):
        raise ModelFilesError(f"identity: {identity!r} must be require, if-known or skip")
    mine = processor_identity(processor, model_files)
    seen: set[tuple[Any, ...]] = set()
    for row in rows:
        theirs = tuple(row.get(k) for k in IDENTITY_KEYS)
        if theirs in seen:
            continue
        seen.add(theirs)
        where = row.get("model_files_root")
        if theirs[0] is None:
            if identity == "require":
                raise ModelFilesError(
                    f"row {_row_name(row)}: tokenizer_sha256 is null, so nothing tells which "
                    "tokenizer, chat template and processor made its ids (a run from before "
                    "they were recorded, or a server folder the collector could not read: "
                    f"model_files_root {where!r}) (fix: identity='if-known' once you know "
                    "the files are the served model's)"
                )
            continue
        for key, value in zip(IDENTITY_KEYS, theirs, strict=True):
            if value is None:
                continue
            if mine[key] is None:
                raise ModelFilesError(
                    f"row {_row_name(row)}: {key} is {value[:12]}... but the processor's "
                    f"{key.removesuffix('_sha256').replace('_', ' ')} files are unknown (its "
                    f"folder: {mine['root']!r}) (fix: load the processor with "
                    "AutoProcessor.from_pretrained(FOLDER), or pass model_files=FOLDER)"
                )
            if value != mine[key]:
                raise ModelFilesError(
                    f"row {_row_name(row)}: {key} {value[:12]}... (served from {where!r}) != "
                    f"{mine[key][:12]}... of the processor's files ({mine['root']!r}): the ids "
                    "were made by another "
                    f"{key.removesuffix('_sha256').replace('_', ' ')} (fix: load the processor "
                    "from the served model's folder)"
                )


def _row_name(row: Mapping[str, Any]) -> str:
    return f"{row.get('rollout_id')!s} step {row.get('step')!s}"


def load_image(images: ImageSource, sha: str):
    """The screenshot ``sha`` as an RGB PIL image (what vLLM feeds the processor: it opens
    the PNG and converts to RGB). ``images``: :data:`ImageSource`. Raises
    ``FileNotFoundError`` naming the file when it is missing."""
    from PIL import Image

    if callable(images):
        data = images(sha)
    else:
        path = Path(images) / f"{sha}.png"
        if not path.is_file():
            raise FileNotFoundError(
                f"screenshot {sha} not found at {path} (fix: images=<run dir>/images of the "
                "row's version: Lake(root).pull_run(version) / 'images')"
            )
        data = path.read_bytes()
    if isinstance(data, str) and data.startswith("data:"):
        data = base64.b64decode(data.split(",", 1)[1])
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def _token_types(processor: Any, ids: list[int]) -> list[int]:
    if hasattr(processor, "create_mm_token_type_ids"):
        return [int(t) for t in processor.create_mm_token_type_ids([ids])[0]]
    image = getattr(processor, "image_token_id", None)
    video = getattr(processor, "video_token_id", None)
    return [1 if t == image else 2 if t == video else 0 for t in ids]


def _runs(types: Sequence[int], kind: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each maximal run of ``kind`` in ``types``."""
    out: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate([*types, -1]):
        if t == kind and start is None:
            start = i
        elif t != kind and start is not None:
            out.append((start, i - start))
            start = None
    return out


def model_inputs(
    row: Mapping[str, Any],
    processor: Any,
    images: ImageSource,
    *,
    identity: Identity = "require",
    model_files: str | Path | None = None,
) -> dict[str, Any]:
    """One sample row as the model's exact inputs (module doc: keys and shapes).

    ``row``: a ``samples`` row as a dict (``read_samples(...).to_pylist()``, a JSONL line of
    ``legato export``); ``processor``: the served model's Hugging Face processor
    (``AutoProcessor.from_pretrained(folder)``); ``images``: :data:`ImageSource`;
    ``identity`` / ``model_files``: :func:`check_model_files`.

    Raises :class:`~legato_pipelines.errors.ModelFilesError` when the row has no prompt or
    response ids, names other model files, its response holds a vision placeholder token (a
    sampled ``<|image_pad|>``: Qwen-VL would take it for an image slot), or its placeholders
    disagree with the screenshots (count of images or tokens per image);
    ``FileNotFoundError`` for a missing screenshot."""
    import torch

    check_model_files([row], processor, identity=identity, model_files=model_files)
    prompt = row.get("prompt_token_ids")
    response = row.get("response_token_ids")
    if not prompt or not response:
        missing = "prompt_token_ids" if not prompt else "response_token_ids"
        raise ModelFilesError(
            f"row {_row_name(row)}: {missing} is empty; the exact input cannot be rebuilt "
            "(fix: collect from a server that returns token ids, e.g. vLLM >= 0.10.2)"
        )
    ids = [int(t) for t in prompt] + [int(t) for t in response]
    types = _token_types(processor, ids)
    shas = list(row.get("image_shas") or [])
    pictures = [load_image(images, sha) for sha in shas]
    sampled = [i for i, t in enumerate(types[len(prompt) :]) if t]
    if sampled:
        raise ModelFilesError(
            f"row {_row_name(row)}: the response holds {len(sampled)} vision placeholder "
            f"token(s) the model sampled (first at response position {sampled[0]}); the model "
            "counts every such token in the input as an image slot, so this row cannot be "
            "recomputed (fix: leave the row out, or keep the server from sampling them: "
            "logit_bias -100 on the vision token ids, as examples/closed_loop does)"
        )
    out: dict[str, Any] = {}
    runs = _runs(types[: len(prompt)], 1)
    if len(runs) != len(pictures):
        raise ModelFilesError(
            f"row {_row_name(row)}: the prompt has {len(runs)} image placeholder run(s) but "
            f"the row names {len(pictures)} screenshot(s) (image_shas) (fix: export the "
            "samples again with this version of legato, which records image_shas)"
        )
    if pictures:
        pixels = processor.image_processor(images=pictures, return_tensors="pt")
        grid = pixels["image_grid_thw"]
        merge = int(getattr(processor.image_processor, "merge_size", 1) or 1)
        for n, ((start, length), thw) in enumerate(zip(runs, grid.tolist(), strict=True)):
            want = math.prod(thw) // (merge * merge)
            if length != want:
                raise ModelFilesError(
                    f"row {_row_name(row)}: image {n} ({shas[n][:12]}...) has {length} "
                    f"placeholder tokens at {start} but the processor makes {want} (grid "
                    f"{thw}, merge {merge}): the server resized it with other settings (fix: "
                    "the served model's preprocessor_config.json)"
                )
        out["pixel_values"] = pixels["pixel_values"]
        out["image_grid_thw"] = grid
    length = len(ids)
    loss_mask = torch.zeros(1, length, dtype=torch.bool)
    loss_mask[0, len(prompt) :] = True
    old = torch.zeros(1, length, dtype=torch.float32)
    logprobs = row.get("response_logprobs") or []
    if len(logprobs) != len(response):
        raise ModelFilesError(
            f"row {_row_name(row)}: {len(logprobs)} response_logprobs for {len(response)} "
            "response_token_ids (fix: keep rows WHERE logprobs_valid)"
        )
    old[0, len(prompt) :] = torch.tensor(
        [math.nan if v is None else float(v) for v in logprobs], dtype=torch.float32
    )
    advantage = row.get("advantage")
    out.update(
        input_ids=torch.tensor([ids], dtype=torch.long),
        attention_mask=torch.ones(1, length, dtype=torch.long),
        mm_token_type_ids=torch.tensor([types], dtype=torch.long),
        loss_mask=loss_mask,
        old_logprobs=old,
        advantage=torch.tensor([math.nan if advantage is None else float(advantage)]),
        prompt_length=len(prompt),
        images=pictures,
        row=dict(row),
    )
    return out


def forward_kwargs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The part of :func:`model_inputs`' answer a model's ``forward`` takes (:data:`MODEL_KEYS`)."""
    return {k: inputs[k] for k in MODEL_KEYS if k in inputs}


def response_logprobs(model: Any, inputs: Mapping[str, Any], temperature: float = 1.0):
    """The model's logprobs of the response tokens, ``[R]`` float32, from one forward pass
    over :func:`model_inputs`' answer (no gradient). ``temperature`` divides the logits first
    (1.0 for vLLM's default ``raw_logprobs``; the run's temperature for
    ``processed_logprobs``)."""
    import torch

    with torch.no_grad():
        logits = model(**forward_kwargs(inputs)).logits[0].float()
    start = int(inputs["prompt_length"])
    ids = inputs["input_ids"][0]
    picked = logits[start - 1 : ids.shape[0] - 1] / temperature
    return torch.log_softmax(picked, dim=-1).gather(-1, ids[start:, None])[:, 0]


class _Rows:
    """A map-style dataset of sample rows (what :class:`SampleDataset` adds torch's base to)."""

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        processor: Any,
        images: ImageSource,
        *,
        identity: Identity = "require",
        model_files: str | Path | None = None,
    ):
        self.rows = list(rows)
        self.processor = processor
        self.images = images
        self.model_files = model_files
        check_model_files(self.rows, processor, identity=identity, model_files=model_files)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return model_inputs(
            self.rows[index], self.processor, self.images, identity="skip"
        )  # checked once, for all rows, at construction


def _dataset_class():
    import torch.utils.data

    class SampleDataset(_Rows, torch.utils.data.Dataset):
        """A PyTorch map-style ``Dataset`` of sample rows: item ``i`` is :func:`model_inputs`
        of row ``i`` (tensors with a batch dimension of 1: use ``batch_size=None`` or your own
        collate). Every row's model files are checked against ``processor`` once, when the
        dataset is made (:func:`check_model_files`).

        ``SampleDataset(rows, processor, images)`` for rows you read yourself;
        :meth:`from_lake` for a partition of a lake. Only rows with valid logprobs and a
        ``group_complete`` advantage are worth training on: filter before (``from_lake`` does)."""

        @classmethod
        def from_lake(
            cls,
            lake: Any,
            version: str,
            processor: Any,
            *,
            identity: Identity = "require",
            model_files: str | Path | None = None,
            complete_groups: bool = True,
        ) -> SampleDataset:
            """The ``samples`` partition of ``version`` in ``lake`` (a root, URL or
            :class:`~legato_pipelines.store.lake.Lake`), rows with ``logprobs_valid`` (and
            ``group_complete`` unless ``complete_groups`` is false), screenshots from the
            version's run directory. Needs pyarrow."""
            import pyarrow.dataset as ds

            from ..store.lake import Lake, read_samples

            store = lake if isinstance(lake, Lake) else Lake(lake)
            where = ds.field("logprobs_valid") == True  # noqa: E712 (an Arrow expression)
            if complete_groups:
                where = where & (ds.field("group_complete") == True)  # noqa: E712
            rows = read_samples(store, [version], where).to_pylist()
            images = store.pull_run(version) / "images"
            return cls(rows, processor, images, identity=identity, model_files=model_files)

    return SampleDataset


def __getattr__(name: str) -> Any:
    if name == "SampleDataset":  # built on first use: torch is imported only then
        cls = _dataset_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
