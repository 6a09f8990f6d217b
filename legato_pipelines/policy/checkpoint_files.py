"""Checkpoint folders on disk: a cheap :func:`fingerprint` of a folder (what proves which
weights a run loaded, ``run.json``'s ``checkpoint`` entry), and :func:`incomplete` (whether a
trainer is still writing one: the checkpoint sensor waits for it).

Nothing here talks to a server: :mod:`.loading` puts a folder into one.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import orjson

from ..errors import LoadError

FINGERPRINT_FILES = (
    "config.json",
    "adapter_config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
)
"""Small files hashed whole by :func:`fingerprint` (plus every ``*.index.json``)."""
HASH_LIMIT = 4 << 20
"""[bytes] config and index files up to this size are hashed whole (larger ones: size only)."""
PARTIAL_SUFFIXES = (".tmp", ".partial", ".incomplete", ".lock")
TEMPORARY_NAME = re.compile(r"\.(tmp|temp|partial|incomplete|lock)[\w-]*$", re.IGNORECASE)
"""A folder name a trainer writes under before renaming it into place (``step-5.tmp``,
``step-6.partial``, ``step-7.tmp-1234``): never a version."""


def fingerprint(folder: str | Path) -> dict[str, Any]:
    """A cheap identity of a checkpoint folder: every file's size (recursively, names relative
    to the folder); the SHA-256 of its config and index files (:data:`FINGERPRINT_FILES`,
    ``*.index.json``; at most :data:`HASH_LIMIT` bytes each); and for every other file (weight
    shards, adapter weights) a content sample: the SHA-256 of its first and last
    :data:`SAMPLE_BYTES` (the whole file when it is smaller than two samples).

    The sample tells one training step from the next although sizes and configs are the same
    (a safetensors file's tail is tensor data) and does not depend on modification times,
    which a copy changes. Cost: one open, two reads of 64 KiB and a seek per file, whatever its
    size (about a millisecond per shard from the page cache, a few disk seeks cold; measured
    in docs/wire-formats.md §5).

    Returns ``{"digest": "sha256:<64 hex>", "files": {name: {"size": bytes, "sha256" | "sample":
    hex}}}``; the digest covers the whole listing, so a rewritten shard, a new or missing file,
    or an edited config changes it. Raises ``LoadError`` when ``folder`` is not a directory.
    """
    root = Path(folder)
    if not root.is_dir():
        raise LoadError(
            f"checkpoint {str(folder)!r} is not a directory (fix: --checkpoint the version's folder)"
        )
    files: dict[str, dict[str, Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            try:
                size = path.stat().st_size
                entry: dict[str, Any] = {"size": size}
                if name in FINGERPRINT_FILES or name.endswith(".index.json"):
                    if size <= HASH_LIMIT:
                        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
                else:
                    entry["sample"] = _sample(path, size)
            except OSError:  # removed while listing
                continue
            files[rel] = entry
    return {"digest": _digest(files), "files": files}


SAMPLE_BYTES = 64 << 10
"""[bytes] read from each end of a weight file by :func:`fingerprint`."""


def _sample(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if size <= 2 * SAMPLE_BYTES:
            digest.update(fh.read())
        else:
            digest.update(fh.read(SAMPLE_BYTES))
            fh.seek(size - SAMPLE_BYTES)
            digest.update(fh.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _digest(files: dict[str, dict[str, Any]]) -> str:
    return "sha256:" + hashlib.sha256(orjson.dumps(files, option=orjson.OPT_SORT_KEYS)).hexdigest()


def same_fingerprint(recorded: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether ``now`` (a ``run.json`` ``checkpoint`` entry of this version) has the folder
    ``recorded`` had. A ``recorded`` entry written before content samples existed (its
    ``files`` have sizes and config hashes only) is compared on what it recorded."""
    old, new = recorded.get("fingerprint"), now.get("fingerprint")
    if old == new:
        return True
    old_files, new_files = recorded.get("files"), now.get("files")
    if not isinstance(old_files, dict) or not isinstance(new_files, dict) or old is None:
        return False
    if any(isinstance(e, dict) and "sample" in e for e in old_files.values()):
        return False
    legacy = {
        name: {k: v for k, v in entry.items() if k != "sample"} for name, entry in new_files.items()
    }
    return _digest(legacy) == old


def incomplete(folder: str | Path, mode: str | None = None) -> str | None:
    """Why a checkpoint folder is not complete yet, or ``None`` when it looks complete: a file
    still being written (``*.tmp``, ``*.partial``, ``*.incomplete``, ``*.lock``); an
    ``*.index.json`` naming shards that are not there (its ``weight_map``); shards named
    ``*-0000i-of-0000n.*`` without their index (it is written after them) or with some of the
    ``n`` missing; ``adapter_config.json`` without adapter weights; ``config.json`` without any
    weights file (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``) or index. An empty folder
    counts as complete (some trainers signal a version with an empty folder, and ``load none``
    needs nothing in it). With a load ``mode`` the folder must also hold what that mode loads:
    ``lora`` ``adapter_config.json`` and adapter weights (PEFT writes the weights first),
    ``weights`` ``config.json`` and weights; an empty folder is then not complete. A few
    ``stat`` calls and the index files read: cheap enough for a sensor tick."""
    root = Path(folder)
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        return f"cannot be listed ({exc.strerror or exc})"
    partial = [n for n in names if n.endswith(PARTIAL_SUFFIXES)]
    if partial:
        return f"still being written ({', '.join(partial[:3])})"
    indexes = [n for n in names if n.endswith(".index.json")]
    for name in indexes:
        try:
            index = orjson.loads((root / name).read_bytes())
            shards = set((index.get("weight_map") or {}).values())
        except (OSError, orjson.JSONDecodeError, AttributeError):
            return f"{name} is not readable JSON yet"
        missing = sorted(s for s in shards if not (root / s).is_file())
        if missing:
            return f"{name} names {len(missing)} missing shard(s), e.g. {missing[0]}"
    sharded: dict[tuple[str, str, int], set[int]] = {}
    for name in names:
        if match := _SHARD.match(name):
            key = (match["stem"], match["ext"], int(match["total"]))
            sharded.setdefault(key, set()).add(int(match["i"]))
    for (stem, ext, total), present in sorted(sharded.items()):
        if not indexes:
            return f"{stem}-*-of-{total:05d}.{ext} shards without their index file yet"
        if len(present) < total:
            return f"{len(present)} of {total} {stem}-*.{ext} shards present"
    if mode == "lora" and "adapter_config.json" not in names:
        return "no adapter_config.json yet (load lora needs it beside the adapter weights)"
    if mode == "weights" and "config.json" not in names:
        return "no config.json yet (load weights needs it beside the weights)"
    if "adapter_config.json" in names and not any(n.startswith("adapter_model") for n in names):
        return "adapter_config.json without adapter_model.* weights"
    if "config.json" in names and not indexes and not any(n.endswith(_WEIGHTS) for n in names):
        return "config.json without model weights yet (no *.safetensors, *.bin or index)"
    return None


_SHARD = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<total>\d{5})\.(?P<ext>safetensors|bin)$")
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")
