"""``LakeResource``: the lake root (Parquet partitions, run directories, ``legato.duckdb``)."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from ..store.lake import Lake


class LakeResource(dg.ConfigurableResource):
    """``root``: the lake directory (LEGATO_LAKE); resolved to an absolute path on use, so
    every process (webserver, daemon, run workers, readers) finds the same files. On many
    hosts: a shared filesystem path or an fsspec URL such as ``s3://bucket/lake``
    (:mod:`legato_pipelines.store.lake`, "Shared lakes")."""

    root: str = Field(description="Lake root directory or s3:// URL (LEGATO_LAKE).")

    @property
    def lake(self) -> Lake:
        return Lake(self.root)
