"""``LakeResource``: the lake root (Parquet partitions, run directories, ``legato.duckdb``)."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from ..store.lake import Lake


class LakeResource(dg.ConfigurableResource):
    """``root``: the lake directory (LEGATO_LAKE); resolved to an absolute path on use, so
    every process (webserver, daemon, run workers, readers) finds the same files."""

    root: str = Field(description="Lake root directory (LEGATO_LAKE).")

    @property
    def lake(self) -> Lake:
        return Lake(self.root)
