"""Materialization metadata people look at: row counts, column schemas, small previews.

Metadata rows are stored forever in the event log, so previews are a few rows of short
values, never a dump.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa

PREVIEW_ROWS = 5
PREVIEW_CHARS = 40


def column_schema(schema: pa.Schema) -> dg.TableSchema:
    """A Dagster ``TableSchema`` from an Arrow schema (type names as Arrow prints them)."""
    return dg.TableSchema(columns=[dg.TableColumn(name=f.name, type=str(f.type)) for f in schema])


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, list):
        text = f"[{len(value)} items]"
    else:
        text = str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def markdown_preview(table: pa.Table, columns: Sequence[str], rows: int = PREVIEW_ROWS) -> str:
    """The first ``rows`` rows of ``columns`` as a markdown table (values cut to 40 chars)."""
    columns = [c for c in columns if c in table.column_names]
    head = table.select(columns).slice(0, rows).to_pylist()
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in head]
    if table.num_rows > rows:
        lines.append(f"\n{table.num_rows - rows} more rows")
    return "\n".join(lines)


def table_metadata(table: pa.Table, path: Path, preview: Sequence[str]) -> dict[str, Any]:
    """``dagster/row_count``, ``dagster/column_schema``, the partition file, a preview."""
    return {
        "dagster/row_count": table.num_rows,
        "dagster/column_schema": column_schema(table.schema),
        "path": dg.MetadataValue.path(str(path)),
        "preview": dg.MetadataValue.md(markdown_preview(table, preview)),
    }


def number(value: float | int | None) -> dg.MetadataValue:
    """A float/int metadata value, or the text ``n/a`` when the engine reported none."""
    if value is None:
        return dg.MetadataValue.text("n/a")
    return (
        dg.MetadataValue.int(value)
        if isinstance(value, int)
        else dg.MetadataValue.float(float(value))
    )


def counts_markdown(counts: Mapping[str, int]) -> str:
    """A status -> count mapping as a two-column markdown table."""
    lines = ["| status | records |", "|---|---|"]
    lines += [f"| {status} | {n} |" for status, n in counts.items() if n]
    return "\n".join(lines)
