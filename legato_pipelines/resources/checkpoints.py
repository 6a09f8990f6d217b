"""``CheckpointSourceResource``: where new policy versions appear (the checkpoint sensor's input).

Two sources:

``directory``  a checkpoints directory the trainer writes; every sub-directory matching
               ``pattern`` (default ``step-*``) is a version named after the folder. With
               ``ready_marker`` set (e.g. ``READY`` or ``adapter_config.json``) a folder counts
               only once that file exists in it, so a half-written checkpoint is not picked up.
``models``     the policy server's ``/v1/models`` list; every model id matching
               ``pattern`` (default ``*``) is a version (vLLM lists LoRA adapters loaded at
               runtime there). A ``/`` in an id becomes ``--`` in the partition key.

Both are one cheap call per evaluation (a directory listing plus one ``stat`` per match, or one
HTTP request), well inside Dagster's 60 s sensor limit. :meth:`CheckpointSourceResource.scan`
also says which folders are *waiting*: no ready marker yet, or not complete
(:func:`~legato_pipelines.policy.loading.incomplete`: a file still being written, an
index naming missing shards, an adapter config without weights); only folders not requested
yet are checked for completeness.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import Literal

import dagster as dg
from pydantic import Field

from ..policy.loading import incomplete
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


def model_version(model_id: str) -> str:
    """Partition key of a model id: ``/`` becomes ``--`` (as the Hugging Face cache names
    ``models--org--name``); raises ``ConfigError`` if the result is still not a valid key."""
    return check_version_key(model_id.replace("/", "--"))


class CheckpointSourceResource(dg.ConfigurableResource):
    """Fields: ``source`` (directory | models; LEGATO_CHECKPOINT_SOURCE), ``directory``
    (LEGATO_CHECKPOINTS), ``pattern`` (a glob; default ``step-*`` for directories, ``*`` for
    models; LEGATO_CHECKPOINT_GLOB), ``ready_marker`` (LEGATO_CHECKPOINT_READY)."""

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

    def discover(self, policy: PolicyResource | None = None) -> list[Checkpoint]:
        """Every version currently visible, oldest first (:meth:`scan` without the waiting
        folders and completeness checks; raises what it raises)."""
        return self.scan(policy, check_complete=False)[0]

    def scan(
        self,
        policy: PolicyResource | None = None,
        *,
        known: set[str] | frozenset[str] = frozenset(),
        check_complete: bool = True,
    ) -> tuple[list[Checkpoint], list[tuple[str, str]]]:
        """``(ready, waiting)``: every version currently visible, oldest first, and the
        matching folders that are not ready yet with why (``"no READY marker yet"``, ``"model
        .safetensors.index.json names 1 missing shard(s) ..."``). Folders whose version is in
        ``known`` (already requested) are never checked for completeness; the ``models``
        source has no waiting versions.

        Raises ``FileNotFoundError`` when the directory does not exist, ``ValueError`` when
        the ``directory`` source has no directory or the ``models`` source no policy resource
        (``ConfigError``, a ``ValueError``, for a name that cannot be a partition key),
        ``httpx.HTTPError`` when the server cannot be listed."""
        if self.source == "models":
            if policy is None:
                raise ValueError(
                    "checkpoint source 'models' needs the policy resource (its /v1/models list)"
                )
            pattern = self.pattern or "*"
            return [
                Checkpoint(version=model_version(m), seen_at=float(i), model=m)
                for i, m in enumerate(policy.list_models())
                if fnmatch.fnmatchcase(m, pattern)
            ], []
        if not self.directory:
            raise ValueError(
                "checkpoint source 'directory' needs a directory (fix: set LEGATO_CHECKPOINTS to "
                "the trainer's checkpoints directory, or LEGATO_CHECKPOINT_SOURCE=models to watch "
                "the policy server's /v1/models)"
            )
        pattern = self.pattern or "step-*"
        found = []
        waiting: list[tuple[str, str]] = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if not entry.is_dir() or not fnmatch.fnmatchcase(entry.name, pattern):
                    continue
                if self.ready_marker and not os.path.exists(
                    os.path.join(entry.path, self.ready_marker)
                ):
                    waiting.append((entry.name, f"no {self.ready_marker} marker yet"))
                    continue
                if check_complete and entry.name not in known:
                    why = incomplete(entry.path)
                    if why is not None:
                        waiting.append((entry.name, why))
                        continue
                found.append(
                    Checkpoint(
                        version=check_version_key(entry.name),
                        seen_at=entry.stat().st_mtime,
                        path=entry.path,
                    )
                )
        return sorted(found, key=lambda c: (c.seen_at, c.version)), sorted(waiting)
