"""The lake: Hive-partitioned Parquet per table and policy version, DuckDB views over it.

Layout under the lake root (ARCHITECTURE §7, DAGSTER.md "Parquet first")::

    <lake>/rollouts/policy_version=<key>/part-0.parquet
    <lake>/steps/policy_version=<key>/part-0.parquet
    <lake>/samples/policy_version=<key>/part-0.parquet
    <lake>/profile/policy_version=<key>/part-0.parquet
    <lake>/runs/policy_version=<key>/      the run directory of that version's collection
    <lake>/legato.duckdb                   views rollouts, steps, samples, profile, time_share

Parquet is the storage; DuckDB is only the read layer. DuckDB allows one writer process per
database file, so nothing ever writes into ``legato.duckdb`` in place: the views are built in
a temp file under an exclusive lock (``<lake>/.legato.duckdb.lock``, ``fcntl.flock``) and
moved over the old file with ``os.replace``. Two partitions materializing at once therefore
never collide, and readers open the file ``read_only=True`` (:meth:`Lake.connect`) while it
is being replaced. The views read ``<lake>/<table>/*/*.parquet``, so a partition written
after the views were built shows up without a rebuild.

Every Parquet write is atomic too: a temp file in the partition directory, then
``os.replace``; a reader sees the old partition or the new one, never half of one.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ConfigError

TABLES = ("rollouts", "steps", "samples", "profile")
"""The lake's tables; each is a directory of ``policy_version=<key>`` partitions and a view."""

PARTITION_COLUMN = "policy_version"
DUCKDB_FILE = "legato.duckdb"
LOCK_FILE = ".legato.duckdb.lock"
PART_FILE = "part-0.parquet"
RUNS_DIR = "runs"

_EXTRA_VIEWS = {
    # One row per (version, phase): the profile's time share unnested, for plots and SQL.
    "time_share": (
        "profile",
        "SELECT policy_version, unnest(map_keys(time_share)) AS phase, "
        "unnest(map_values(time_share)) AS share FROM profile",
    ),
}


def check_partition_key(key: str) -> str:
    """Return ``key`` if it can name a partition directory and a Dagster dynamic partition.

    Raises :class:`~legato_pipelines.errors.ConfigError` for an empty key, ``/`` or ``\\``,
    ``...`` (Dagster forbids it), ``.``/``..``, or control characters.
    """
    if (
        not isinstance(key, str)
        or not key
        or key in (".", "..")
        or "/" in key
        or "\\" in key
        or "..." in key
        or any(ord(c) < 32 for c in key)
    ):
        raise ConfigError(
            f"policy_version {key!r}: a partition key must be non-empty, without '/', '\\', '...' "
            "or control characters (e.g. 'step-7')"
        )
    return key


class Lake:
    """A lake root directory (created on first write).

    ``root`` is resolved to an absolute path once, so every process that opens the DuckDB
    file finds the same Parquet files whatever its working directory.
    """

    def __init__(self, root: str | Path):
        if not str(root).strip():
            raise ConfigError("lake: the lake root is empty (fix: set LEGATO_LAKE to a directory)")
        self.root = Path(root).expanduser().resolve()

    def __repr__(self) -> str:
        return f"Lake({str(self.root)!r})"

    @property
    def duckdb_path(self) -> Path:
        """``<lake>/legato.duckdb``: the views; open it with :meth:`connect` (read-only)."""
        return self.root / DUCKDB_FILE

    def run_dir(self, version: str) -> Path:
        """The run directory of ``version``'s collection: ``<lake>/runs/policy_version=<key>``.

        Collecting the same version again resumes it (the engine's resume rule)."""
        return self.root / RUNS_DIR / f"{PARTITION_COLUMN}={check_partition_key(version)}"

    def partition_dir(self, table: str, version: str) -> Path:
        """``<lake>/<table>/policy_version=<key>``; ``ConfigError`` for an unknown table."""
        if table not in TABLES:
            raise ConfigError(f"lake: unknown table {table!r} (one of {', '.join(TABLES)})")
        return self.root / table / f"{PARTITION_COLUMN}={check_partition_key(version)}"

    def partition_file(self, table: str, version: str) -> Path:
        return self.partition_dir(table, version) / PART_FILE

    def versions(self, table: str) -> list[str]:
        """Policy versions with a written partition of ``table``, sorted."""
        base = self.root / table
        prefix = f"{PARTITION_COLUMN}="
        if not base.is_dir():
            return []
        return sorted(
            p.name[len(prefix) :]
            for p in base.iterdir()
            if p.name.startswith(prefix) and (p / PART_FILE).is_file()
        )

    def write(self, table: str, version: str, data: pa.Table) -> Path:
        """Write one partition atomically (temp file, then ``os.replace``); return its path.

        The table must carry a ``policy_version`` column equal to ``version`` in every row
        (``ValueError`` otherwise), so a file read on its own still says which version it is.
        """
        if PARTITION_COLUMN not in data.column_names:
            raise ValueError(f"lake.write({table!r}): the table has no {PARTITION_COLUMN!r} column")
        values = set(data.column(PARTITION_COLUMN).unique().to_pylist())
        if values - {version}:
            raise ValueError(
                f"lake.write({table!r}, {version!r}): rows of other versions {sorted(map(str, values - {version}))}"
            )
        target = self.partition_file(table, version)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            pq.write_table(data, tmp, compression="zstd")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target

    def read(self, table: str, version: str) -> pa.Table:
        """One partition as Arrow; ``FileNotFoundError`` when it was never written."""
        path = self.partition_file(table, version)
        if not path.is_file():
            raise FileNotFoundError(
                f"lake: no {table} partition for policy_version {version!r} at {path}"
            )
        return pq.read_table(path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK_FILE, "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def view_sql(self) -> dict[str, str]:
        """``CREATE VIEW`` statements for the tables that have at least one partition."""
        statements: dict[str, str] = {}
        for table in TABLES:
            if not self.versions(table):
                continue
            pattern = str(self.root / table / "*" / "*.parquet").replace("'", "''")
            statements[table] = (
                f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{pattern}', "
                f"hive_partitioning = true, hive_types = {{'{PARTITION_COLUMN}': VARCHAR}}, "
                "union_by_name = true)"
            )
        for name, (needs, select) in _EXTRA_VIEWS.items():
            if needs in statements:
                statements[name] = f"CREATE VIEW {name} AS {select}"
        return statements

    def refresh_views(self) -> list[str]:
        """Rebuild ``legato.duckdb`` with a view per table that has data; return the view names.

        Holds the lake's exclusive lock, builds the database in a temp file and moves it into
        place, so concurrent callers serialize and readers never see a half-built file.
        """
        with self._locked():
            statements = self.view_sql()
            tmp = self.root / f".{DUCKDB_FILE}.{uuid.uuid4().hex}.tmp"
            try:
                con = duckdb.connect(str(tmp))
                try:
                    for sql in statements.values():
                        con.execute(sql)
                    con.execute("CHECKPOINT")
                finally:
                    con.close()
                os.replace(tmp, self.duckdb_path)
            finally:
                tmp.unlink(missing_ok=True)
                Path(f"{tmp}.wal").unlink(missing_ok=True)
        return list(statements)

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A read-only connection to ``legato.duckdb`` (any number of readers at once).

        Raises ``FileNotFoundError`` before the first materialization built it."""
        if not self.duckdb_path.is_file():
            raise FileNotFoundError(
                f"lake: {self.duckdb_path} does not exist yet (materialize a partition first)"
            )
        return duckdb.connect(str(self.duckdb_path), read_only=True)

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        """Run one SQL query on the views (read-only) and return the result as Arrow."""
        con = self.connect()
        try:
            return con.sql(sql, params=params).to_arrow_table()
        finally:
            con.close()
