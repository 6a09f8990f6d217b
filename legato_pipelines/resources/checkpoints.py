"""``CheckpointSourceResource``: where new policy versions appear (the checkpoint sensor's input).

Two sources:

``directory``  a checkpoints directory the trainer writes; every sub-directory matching
               ``pattern`` (default ``step-*``) is a version named after the folder.
``models``     the policy server's ``/v1/models`` list; every model id matching
               ``pattern`` (default ``*``) is a version (vLLM lists LoRA adapters loaded at
               runtime there). A ``/`` in an id becomes ``--`` in the partition key.

When a folder counts (``directory``): by default once it is **complete** and **stable**.
Complete (:func:`~legato_pipelines.policy.checkpoint_files.incomplete`): no file still being written,
every shard its ``*.index.json`` names present, sharded weights only with their index, adapter
weights beside ``adapter_config.json``, weights beside ``config.json``; and what the policy
resource's ``load`` mode loads: ``lora`` needs ``adapter_config.json`` and adapter weights
(PEFT writes the weights first), ``weights`` needs ``config.json`` and all shards (an empty
folder waits in both). A folder under a temporary name (``step-5.tmp``, ``step-6.partial``:
:data:`~legato_pipelines.policy.checkpoint_files.TEMPORARY_NAME`) is never a version: it waits, named,
until the trainer renames it. Stable: its files'
sizes (and modification times) are the same on two sensor ticks in a row, kept in the
sensor's cursor (:attr:`Scan.sizes`), or no file in it changed for ``stable_s`` seconds
(an old checkpoint counts at once). ``stable_s=0`` counts a folder as soon as it is complete
(a trainer that renames a finished folder into place). With ``ready_marker`` set (e.g.
``READY``) a folder counts once that file exists in it and it is complete: the marker is the
trainer's word, no stability wait.

A folder or model id that cannot be a version key
(:func:`~legato_pipelines.versions.check_version_key`: ``step-5_lr=3e-6``) is refused, with
the reason and the key to rename it to (:attr:`Scan.refused`); the others go on.

Both sources are one cheap call per evaluation (a directory listing, one ``stat`` per file of a
folder not requested yet, the index files read; or one HTTP request), well inside Dagster's
60 s sensor limit. Folders already requested (``known``) are not looked into again.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Literal

import dagster as dg
from pydantic import Field

from ..errors import ConfigError
from ..policy.checkpoint_files import TEMPORARY_NAME, incomplete
from ..versions import check_version_key
from .policy import PolicyResource


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A policy version found by the source: its partition key, when it appeared (unix s, for
    ordering), and the model id to call (``models`` source) or its folder (``directory``)."""

    version: str
    seen_at: float
    model: str | None = None
    path: str | None = None


@dataclass(frozen=True, slots=True)
class Scan:
    """What one look at the source found.

    Fields:
      ready    versions that count now, oldest first
      waiting  ``(folder name, why)`` of matching folders that do not count yet, by name
      refused  ``(folder name or model id, why)`` of matches that can never be a version
               (no valid key; the reason names the folder or model and the key to use)
      sizes    ``{folder name: size signature}`` of the complete folders not requested yet:
               the next scan's ``sizes`` (the sensor keeps it in its cursor)
    """

    ready: list[Checkpoint]
    waiting: list[tuple[str, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    sizes: dict[str, str] = field(default_factory=dict)


def model_version(model_id: str) -> str:
    """Partition key of a model id: ``/`` becomes ``--`` (as the Hugging Face cache names
    ``models--org--name``); raises ``ConfigError`` if the result is still not a valid key."""
    return check_version_key(model_id.replace("/", "--"))


def folder_state(path: str) -> tuple[str, float]:
    """``(signature, newest)`` of a checkpoint folder: a hash (16 hex digits) of every file's
    relative path, size [bytes] and modification time [ns], and the newest modification time
    of any file or folder in it [unix s]. ``os.walk`` plus one ``stat`` per file."""
    digest = hashlib.sha256()
    newest = os.stat(path).st_mtime
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:  # vanished between listing and stat: it is being written
                digest.update(f"{full}:gone\n".encode())
                continue
            newest = max(newest, st.st_mtime)
            rel = os.path.relpath(full, path)
            digest.update(f"{rel}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        for name in dirs:
            try:
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
            except OSError:
                pass
    return digest.hexdigest()[:16], newest


class CheckpointSourceResource(dg.ConfigurableResource):
    """Fields: ``source`` (directory | models; LEGATO_CHECKPOINT_SOURCE), ``directory``
    (LEGATO_CHECKPOINTS), ``pattern`` (a glob; default ``step-*`` for directories, ``*`` for
    models; LEGATO_CHECKPOINT_GLOB), ``ready_marker`` (LEGATO_CHECKPOINT_READY), ``stable_s``
    (LEGATO_CHECKPOINT_STABLE_S; see the module doc)."""

    source: Literal["directory", "models"] = Field(
        default="directory", description="Where new versions appear."
    )
    directory: str | None = Field(
        default=None, description="Checkpoints directory (LEGATO_CHECKPOINTS)."
    )
    pattern: str | None = Field(
        default=None, description="Glob a folder name / model id must match."
    )
    ready_marker: str | None = Field(
        default=None, description="File that must exist in a checkpoint folder."
    )
    stable_s: int = Field(
        default=30,
        ge=0,
        description="A complete folder counts once its file sizes are unchanged over two "
        "sensor ticks, or nothing in it changed for this many seconds (0: at once). "
        "Not used with ready_marker.",
    )

    def discover(self, policy: PolicyResource | None = None) -> list[Checkpoint]:
        """Every version currently visible, oldest first, whatever its state (no completeness,
        stability or marker checks beyond the marker; raises what :meth:`scan` raises)."""
        return self.scan(policy, check_complete=False).ready

    def scan(
        self,
        policy: PolicyResource | None = None,
        *,
        known: set[str] | frozenset[str] = frozenset(),
        sizes: dict[str, str] | None = None,
        check_complete: bool = True,
        now: float | None = None,
    ) -> Scan:
        """Look at the source once (module doc): which versions count now, which folders wait
        and why (``"no READY marker yet"``, ``"model.safetensors.index.json names 1 missing
        shard(s) ..."``, ``"sizes still changing ..."``), which matches are refused. ``known``:
        versions already requested (counted without looking into them); ``sizes``: the
        previous scan's :attr:`Scan.sizes`; ``now``: the time [unix s] (default: the clock).
        ``check_complete=False`` skips the completeness and stability checks.

        Raises ``FileNotFoundError`` when the directory does not exist, ``ValueError`` when
        the ``directory`` source has no directory or the ``models`` source no policy resource,
        ``PolicyConfigError`` (a ``ValueError`` too) naming the URL and the fix when the server
        cannot be listed (:meth:`PolicyResource.list_models`)."""
        if self.source == "models":
            return self._models(policy)
        if not self.directory:
            raise ValueError(
                "checkpoint source 'directory' needs a directory (fix: set LEGATO_CHECKPOINTS to "
                "the trainer's checkpoints directory, or LEGATO_CHECKPOINT_SOURCE=models to watch "
                "the policy server's /v1/models)"
            )
        pattern = self.pattern or "step-*"
        mode = policy.load if policy is not None else None  # what a run will load from it
        now = time.time() if now is None else now
        previous = sizes or {}
        out = Scan(ready=[])
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if not entry.is_dir() or not fnmatch.fnmatchcase(entry.name, pattern):
                    continue
                if TEMPORARY_NAME.search(entry.name):
                    out.waiting.append((entry.name, "a temporary name: counts once renamed"))
                    continue
                try:
                    version = check_version_key(entry.name)
                except ConfigError as exc:
                    out.refused.append((entry.name, f"folder {entry.path}: {exc}; rename it"))
                    continue
                why = None
                if self.ready_marker and not os.path.exists(
                    os.path.join(entry.path, self.ready_marker)
                ):
                    why = f"no {self.ready_marker} marker yet"
                elif check_complete and version not in known:
                    why = incomplete(entry.path, mode)
                    if why is None and not self.ready_marker:
                        why = self._unsettled(entry.path, previous.get(version), now, out, version)
                if why is not None:
                    out.waiting.append((entry.name, why))
                    continue
                out.ready.append(
                    Checkpoint(version=version, seen_at=entry.stat().st_mtime, path=entry.path)
                )
        out.ready.sort(key=lambda c: (c.seen_at, c.version))
        out.waiting.sort()
        out.refused.sort()
        return out

    def _unsettled(
        self, path: str, before: str | None, now: float, out: Scan, version: str
    ) -> str | None:
        """Why a complete folder does not count yet (its sizes may still change), or ``None``:
        unchanged since the previous tick, or nothing in it changed for ``stable_s``."""
        if self.stable_s == 0:
            return None
        signature, newest = folder_state(path)
        out.sizes[version] = signature  # kept until the version is requested
        if signature == before or now - newest >= self.stable_s:
            return None
        if before is None:
            return "sizes recorded; counts when unchanged on the next tick"
        return "sizes still changing since the last tick"

    def _models(self, policy: PolicyResource | None) -> Scan:
        if policy is None:
            raise ValueError(
                "checkpoint source 'models' needs the policy resource (its /v1/models list)"
            )
        pattern = self.pattern or "*"
        out = Scan(ready=[])
        for i, model in enumerate(policy.list_models()):
            if not fnmatch.fnmatchcase(model, pattern):
                continue
            try:
                version = model_version(model)
            except ConfigError as exc:
                out.refused.append((model, f"model id {model!r}: {exc}"))
                continue
            out.ready.append(Checkpoint(version=version, seen_at=float(i), model=model))
        return out
