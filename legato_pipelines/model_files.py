"""What made the token ids: the tokenizer, chat template and processor of the served model.

A trainer rebuilds a sample's model inputs from its prompt ids and screenshots
(:mod:`legato_pipelines.trainer.inputs`); that is only exact with the tokenizer, chat template
and image processor the server used. Every run records them (``run.json``'s ``model_files``)
and every sample row carries them (``tokenizer_sha256``, ``chat_template_sha256``,
``processor_sha256``, ``model_files_root``), so a trainer can refuse data made by other files.

Where the files are: vLLM lists the served model in ``/v1/models`` with ``root`` = the folder
it was started from (``--model``); an adapter's entry names its base in ``parent``, and the
server tokenizes with the base's files whatever adapter or weights update it serves since
(vLLM and SGLang keep the tokenizer they started with). When that root is a folder on this
host its files are hashed (:func:`files_identity`); otherwise (a remote server, a hub id) the
run records the root with ``source: "unreadable"`` and no hashes.

Hashes (hex SHA-256, each over the named parts in sorted order, ``name NUL bytes NUL``):

``tokenizer``      ``tokenizer.json``, ``vocab.json``, ``merges.txt``, ``tokenizer.model``,
                   ``added_tokens.json``, ``special_tokens_map.json`` as bytes, and
                   ``tokenizer_config.json`` without its ``chat_template`` key (canonical JSON)
``chat_template``  the template text itself, found as transformers finds it:
                   ``chat_template.jinja``, else ``chat_template.json``'s ``chat_template``, else
                   ``tokenizer_config.json``'s (a list of named templates: canonical JSON)
``processor``      ``preprocessor_config.json``, ``video_preprocessor_config.json`` and
                   ``processor_config.json`` (without ``chat_template``) as canonical JSON

A part the folder lacks is left out; a hash with no part at all is ``None``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "special_tokens_map.json",
)
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
)
IDENTITY_KEYS = ("tokenizer_sha256", "chat_template_sha256", "processor_sha256")
"""The identity's hashes, as ``run.json``'s ``model_files`` and the sample columns name them."""


def _canonical_json(path: Path, drop: Iterable[str] = ()) -> bytes:
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict):
        for key in drop:
            data.pop(key, None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _digest(parts: Mapping[str, bytes]) -> str | None:
    if not parts:
        return None
    h = hashlib.sha256()
    for name in sorted(parts):
        h.update(name.encode() + b"\0" + parts[name] + b"\0")
    return h.hexdigest()


def template_sha256(template: Any) -> str | None:
    """The hash of a chat template: its text (a string), or the canonical JSON of a
    transformers list/dict of named templates; ``None`` for no template."""
    if template is None or template == "":
        return None
    if isinstance(template, str):
        text = template
    else:
        text = json.dumps(template, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _digest({"chat_template": text.encode()})


def chat_template_of(folder: Path) -> Any:
    """The chat template a model folder gives transformers (module doc's order), or ``None``."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    for name in ("chat_template.json", "processor_config.json", "tokenizer_config.json"):
        path = folder / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("chat_template"):
                return data["chat_template"]
    return None


def files_identity(folder: str | Path) -> dict[str, Any]:
    """The identity of a model folder's tokenizer, chat template and processor (module doc):
    ``{"root": folder, "source": "folder", "tokenizer_sha256": hex | None,
    "chat_template_sha256": ..., "processor_sha256": ...}``. Reads only the small config and
    vocabulary files, never weights. Raises ``FileNotFoundError`` when ``folder`` is not a
    directory, ``ValueError`` for a config file that is not JSON."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"model files: {str(folder)!r} is not a directory")
    tokenizer: dict[str, bytes] = {}
    for name in TOKENIZER_FILES:
        if (root / name).is_file():
            tokenizer[name] = (root / name).read_bytes()
    if (root / "tokenizer_config.json").is_file():
        tokenizer["tokenizer_config.json"] = _canonical_json(
            root / "tokenizer_config.json", ("chat_template",)
        )
    processor = {
        name: _canonical_json(root / name, ("chat_template",))
        for name in PROCESSOR_FILES
        if (root / name).is_file()
    }
    return {
        "root": str(root),
        "source": "folder",
        "tokenizer_sha256": _digest(tokenizer),
        "chat_template_sha256": template_sha256(chat_template_of(root)),
        "processor_sha256": _digest(processor),
    }


def base_root(listing: Iterable[Mapping[str, Any]], model: str) -> str | None:
    """The folder the server started ``model``'s base from: the ``root`` of ``model``'s
    ``/v1/models`` entry, following ``parent`` (an adapter's base) to the base's entry.
    ``None`` when the listing does not name it."""
    entries = {str(m.get("id")): m for m in listing if isinstance(m, Mapping)}
    seen: set[str] = set()
    name: str | None = model
    while name is not None and name in entries and name not in seen:
        seen.add(name)
        entry = entries[name]
        parent = entry.get("parent")
        if parent and parent != name:
            name = str(parent)
            continue
        root = entry.get("root")
        return str(root) if root else None
    return None


def served_identity(listing: Iterable[Mapping[str, Any]], model: str) -> dict[str, Any]:
    """``run.json``'s ``model_files``: :func:`files_identity` of the base folder the server
    reports for ``model`` (:func:`base_root`) with ``source: "server_root"``; when the
    server names no root, or one that is no folder here, the hashes are ``None`` and
    ``source`` says why (``"unreported"`` | ``"unreadable"``)."""
    root = base_root(listing, model)
    empty = dict.fromkeys(IDENTITY_KEYS)
    if root is None:
        return {"root": None, "source": "unreported", **empty}
    try:
        found = files_identity(root)
    except (OSError, ValueError):
        return {"root": root, "source": "unreadable", **empty}
    return {**found, "source": "server_root"}
