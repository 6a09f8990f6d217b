"""Storage: the run directory (``legato.rollout/v0``), step export, and the Parquet/DuckDB lake.

``read_samples(lake, versions=None)`` and ``read_table(lake, table, versions=None)`` read the
lake's Parquet with every column of every version of the project (:mod:`.lake`); they are
imported on first use, so ``import legato_pipelines.store`` stays light.
"""

from typing import Any

_LAZY = {"read_samples", "read_table", "Lake"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import lake

        return getattr(lake, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
