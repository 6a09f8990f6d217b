"""Storage: the run directory (``legato.rollout/v0``), step export, and the Parquet/DuckDB lake."""
