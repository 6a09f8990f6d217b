"""The lake: Hive-partitioned Parquet per table and policy version, DuckDB views over it.

Layout under the lake root (docs/architecture.md §7)::

    <lake>/rollouts/policy_version=<key>/part-0.parquet
    <lake>/steps/policy_version=<key>/part-0.parquet
    <lake>/samples/policy_version=<key>/part-0.parquet
    <lake>/profile/policy_version=<key>/part-0.parquet
    <lake>/runs/policy_version=<key>/      the run directory of that version's collection
    <lake>/charts/policy_version=<key>/    that version's PNG charts (profile_summary's)
    <lake>/legato.duckdb                   views rollouts, steps, samples, profile, time_share

A table's directory holds Parquet files and nothing else (temp files start with ``.``, which
pyarrow, pandas and DuckDB's ``*.parquet`` glob all skip), so ``ds.dataset("<lake>/profile",
partitioning="hive")`` and ``pd.read_parquet`` read any table folder as it is.

**Versions of the project.** Partitions written by an older release hold fewer columns than
today's (the schemas in :mod:`.lake_tables` and :mod:`.export` only ever grow). A reader that
takes one file's schema for the whole folder (``ds.dataset(folder)``, ``pd.read_parquet(folder)``:
pyarrow infers it from the first file) silently drops the newer columns, so the lake's readers
use the union of every partition's schema: :meth:`Lake.dataset` / :func:`read_table` (pyarrow:
``pa.unify_schemas`` over the files' schemas and today's) and the views (DuckDB
``union_by_name``). A column a file lacks reads as null.

**Dropping a version.** :meth:`Lake.drop` removes a version's partitions and charts (and, if
asked, its run directory) and rebuilds the views (``legato lake drop VERSION``).

Parquet is the storage; DuckDB is only the read layer. DuckDB allows one writer process per
database file, so nothing ever writes into ``legato.duckdb`` in place: the views are built in
a temp file under an exclusive lock (``<lake>/.legato.duckdb.lock``, ``fcntl.flock``) and
moved over the old file with ``os.replace``. Two partitions materializing at once therefore
never collide, and readers open the file ``read_only=True`` (:meth:`Lake.connect`) while it
is being replaced. Another process that opens ``legato.duckdb`` read-write (a DuckDB shell, a
notebook's ``duckdb.connect`` without ``read_only``) locks every reader out: :meth:`Lake.connect`
then raises :class:`LakeLockedError`, naming the holder's pid and the way around it,
``Lake.connect(parquet=True)`` (``legato lake query --parquet``): the same views in an
in-memory database over the Parquet files. The file is written for DuckDB 1.x's storage
format (:data:`STORAGE_COMPATIBILITY`), so DuckDB 1.0 and later open it. The views read ``<lake>/<table>/*/*.parquet``, so a partition written
after the views were built shows up without a rebuild. They take ``policy_version`` from the
files (every partition file carries it, :meth:`Lake.write` checks), not from folder names, so
a folder whose name is no valid key (one written before keys were checked:
``policy_version=step-5_lr=3e-6``, which DuckDB's hive partitioning refuses for every table)
never breaks the views of the other versions; :meth:`Lake.versions` leaves such a folder out.
Keys are checked by :func:`~legato_pipelines.versions.check_version_key` wherever a path is
made from one.

Every Parquet write is atomic too: a temp file in the partition directory, then
``os.replace``; a reader sees the old partition or the new one, never half of one.

**Shared lakes.** The root may be an fsspec URL (``s3://bucket/lake``, ``gs://...``; object
store credentials and endpoint from the usual variables, e.g. ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``) so runs on any worker host write where the
trainer reads; a shared filesystem is just a local path. On an object store a partition is one
object ``PUT`` (visible whole or not at all: atomic without a rename), ``legato.duckdb`` is a
per-host file in the local cache (``LEGATO_LAKE_CACHE``, default ``~/.cache/legato/lakes``)
whose views read the same ``s3://`` URLs through fsspec (:meth:`Lake.connect` registers the
filesystem), and run directories are staged: the engine writes a local copy
(:meth:`Lake.run_dir`), :meth:`Lake.push_run` uploads it to ``<lake>/runs/policy_version=<key>/``
and :meth:`Lake.pull_run` brings it to a host that lacks it (a resume, or a later step on
another worker). Local roots behave exactly as without this.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ..errors import ConfigError, LegatoError
from ..versions import check_version_key, sort_versions

TABLES = ("rollouts", "steps", "samples", "profile")
"""The lake's tables; each is a directory of ``policy_version=<key>`` partitions and a view."""

PARTITION_COLUMN = "policy_version"
DUCKDB_FILE = "legato.duckdb"
LOCK_FILE = ".legato.duckdb.lock"
PART_FILE = "part-0.parquet"
RUNS_DIR = "runs"
CHARTS_DIR = "charts"
RECORDS_FILE = "rollouts.jsonl"
CACHE_ENV = "LEGATO_LAKE_CACHE"
STORAGE_COMPATIBILITY = "v1.0.0"
"""DuckDB ``storage_compatibility_version`` of ``legato.duckdb``: the storage format DuckDB 1.0
and every later release read (storage version 64 in the file's header). DuckDB 2.x's default,
``latest``, writes a header (version 999) that DuckDB 1.x refuses; the views need nothing newer."""
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "az", "abfss"})
"""fsspec protocols whose writes are single atomic PUTs (no rename needed, none available)."""

_EXTRA_VIEWS = {
    # One row per (version, phase): the profile's time share unnested, for plots and SQL.
    "time_share": (
        "profile",
        "SELECT policy_version, unnest(map_keys(time_share)) AS phase, "
        "unnest(map_values(time_share)) AS share FROM profile",
    ),
}


class LakeLockedError(LegatoError):
    """``legato.duckdb`` is open read-write in another process, so DuckDB lets no reader in.
    ``pid`` is the holder's process id as DuckDB reports it (``None`` when it names none)."""

    def __init__(self, message: str, pid: int | None = None):
        super().__init__(message)
        self.pid = pid


def _locked_message(path: Path, exc: duckdb.Error) -> LakeLockedError | None:
    """The clear error for DuckDB's "Could not set lock" on ``path``, or ``None`` for another
    error. DuckDB's message names the holder: ``Conflicting lock is held in <program> (PID n)``."""
    text = str(exc)
    if "Could not set lock" not in text and "Conflicting lock" not in text:
        return None
    match = re.search(r"held in (.+?) \(PID (\d+)\)", text)
    pid = int(match.group(2)) if match else None
    holder = f"process {pid} ({match.group(1)})" if match else "another process"
    return LakeLockedError(
        f"lake: {path} is open read-write in {holder}, so DuckDB lets no reader in. "
        "Legato itself never holds it open (materializations build the views in a temp file), "
        "so this is a DuckDB shell or script that opened it without read_only: close it "
        f"(or wait for it to finish{f'; `ps -p {pid} -o args=` shows what it is' if pid else ''}), "
        "open it with duckdb.connect(..., read_only=True) from now on, or query the Parquet "
        "files directly: `legato lake query --parquet` (Lake.query(sql, parquet=True)).",
        pid,
    )


def _valid_key(name: str) -> bool:
    try:
        check_version_key(name)
    except ConfigError:
        return False
    return True


def is_url(root: str | Path) -> bool:
    """True for an fsspec URL (``s3://...``); local paths and ``file://`` URLs are not."""
    text = str(root)
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text)) and not text.startswith("file://")


class Lake:
    """A lake root directory (created on first write), or an fsspec URL (module doc).

    A local ``root`` is resolved to an absolute path once, so every process that opens the
    DuckDB file finds the same Parquet files whatever its working directory. A URL root stays
    a string (``self.root``, without a trailing ``/``); ``self.fs`` is its fsspec filesystem
    (``None`` for local roots). Raises ``ConfigError`` for an empty root or a URL whose
    protocol fsspec does not know (or whose driver, e.g. ``s3fs``, is not installed).
    """

    def __init__(self, root: str | Path):
        if not str(root).strip():
            raise ConfigError("lake: the lake root is empty (fix: set LEGATO_LAKE to a directory)")
        self.fs = None
        if is_url(root):
            import fsspec

            text = str(root).strip().rstrip("/")
            try:
                # a fresh instance: fsspec's cache would keep an endpoint/credentials read
                # from the environment of an earlier lake in this process
                self.fs, _ = fsspec.core.url_to_fs(text, skip_instance_cache=True)
            except (ImportError, ValueError) as exc:
                raise ConfigError(
                    f"lake: cannot open {text!r} ({exc}) (fix: pip install 'legato-pipelines[scale]' "
                    "for s3://, or use a shared filesystem path)"
                ) from None
            self.root: Path | str = text
            base = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "legato" / "lakes")
            name = re.sub(r"[^A-Za-z0-9_.-]+", "-", text.split("://", 1)[1]).strip("-")[:60]
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            self._cache = base.expanduser().resolve() / f"{name}-{digest}"
        else:
            text = str(root)[len("file://") :] if str(root).startswith("file://") else root
            self.root = Path(text).expanduser().resolve()

    def __repr__(self) -> str:
        return f"Lake({str(self.root)!r})"

    @property
    def remote(self) -> bool:
        """True when the root is an fsspec URL (run directories are staged locally)."""
        return self.fs is not None

    def _join(self, *parts: str) -> Path | str:
        if self.fs is None:
            return self.root.joinpath(*parts)
        return "/".join([self.root, *parts])

    @property
    def cache_dir(self) -> Path:
        """This host's local directory for a URL lake (views file, staged run directories):
        ``$LEGATO_LAKE_CACHE/<readable name>-<hash of the URL>``, fixed when the lake is
        opened. Local lakes: the root."""
        return self.root if self.fs is None else self._cache

    @property
    def duckdb_path(self) -> Path:
        """``<lake>/legato.duckdb``: the views; open it with :meth:`connect` (read-only).
        For a URL lake the file is in this host's :attr:`cache_dir`."""
        return self.cache_dir / DUCKDB_FILE

    def run_dir(self, version: str) -> Path:
        """The run directory of ``version``'s collection: ``<lake>/runs/policy_version=<key>``.

        Collecting the same version again resumes it (the engine's resume rule). For a URL
        lake this is the local staging copy in :attr:`cache_dir` (see :meth:`pull_run`)."""
        return self.cache_dir / RUNS_DIR / f"{PARTITION_COLUMN}={check_version_key(version)}"

    def run_location(self, version: str) -> Path | str:
        """Where ``version``'s run directory is kept: :meth:`run_dir`, or its URL in the lake."""
        return self._join(RUNS_DIR, f"{PARTITION_COLUMN}={check_version_key(version)}")

    def pull_run(self, version: str) -> Path:
        """The local run directory of ``version``, brought up to date from a URL lake: the
        lake's copy replaces the local one when it holds more records (records are only ever
        appended, so the longer ``rollouts.jsonl`` is the newer run). Local lakes: :meth:`run_dir`."""
        local = self.run_dir(version)
        if self.fs is None:
            return local
        remote = self.run_location(version)
        remote_records = f"{remote}/{RECORDS_FILE}"
        self.fs.invalidate_cache()
        if not self.fs.exists(remote_records):
            return local
        local_records = local / RECORDS_FILE
        local_size = local_records.stat().st_size if local_records.is_file() else -1
        if self.fs.size(remote_records) > local_size:
            tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex}.pull")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.get(f"{remote}/", f"{tmp}/", recursive=True)
                shutil.rmtree(local, ignore_errors=True)
                os.replace(tmp, local)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return local

    def push_run(self, version: str) -> Path | str:
        """Upload the local run directory of ``version`` to a URL lake; return where it is kept.

        Each file is one atomic object write. Content-addressed files (``images/``,
        ``messages/``: named by their sha) already in the lake are skipped; the top-level
        files (records, summary, run metadata) are always sent. Local lakes: nothing to do."""
        local = self.run_dir(version)
        remote = self.run_location(version)
        if self.fs is None or not local.is_dir():
            return remote
        self.fs.invalidate_cache()
        prefix = self.fs._strip_protocol(remote).rstrip("/") + "/"
        present = (
            {p[len(prefix) :] for p in self.fs.find(remote)} if self.fs.exists(remote) else set()
        )
        for path in sorted(local.rglob("*")):
            if not path.is_file() or path.name.startswith("."):
                continue
            name = path.relative_to(local).as_posix()
            if "/" in name and name in present:
                continue
            self.fs.put_file(str(path), f"{remote}/{name}")
        return remote

    def partition_dir(self, table: str, version: str) -> Path | str:
        """``<lake>/<table>/policy_version=<key>``; ``ConfigError`` for an unknown table."""
        if table not in TABLES:
            raise ConfigError(f"lake: unknown table {table!r} (one of {', '.join(TABLES)})")
        return self._join(table, f"{PARTITION_COLUMN}={check_version_key(version)}")

    def partition_file(self, table: str, version: str) -> Path | str:
        if self.fs is not None:
            return f"{self.partition_dir(table, version)}/{PART_FILE}"
        return self.partition_dir(table, version) / PART_FILE

    def versions(self, table: str, *, file: str = PART_FILE) -> list[str]:
        """Policy versions with a written partition of ``table``, in training order
        (:func:`~legato_pipelines.versions.sort_versions`: ``step-50`` before ``step-100``).
        A folder whose name is no valid version key is left out (module doc). ``file``: what
        a partition folder holds (``versions(RUNS_DIR, file="run.json")``: run directories)."""
        prefix = f"{PARTITION_COLUMN}="
        if self.fs is not None:
            self.fs.invalidate_cache()  # other hosts write here too: no stale listings
            found = self.fs.glob(f"{self._join(table)}/{prefix}*/{file}")
            names = [p.rstrip("/").split("/")[-2][len(prefix) :] for p in found]
        else:
            base = self.root / table
            if not base.is_dir():
                return []
            names = [
                p.name[len(prefix) :]
                for p in base.iterdir()
                if p.name.startswith(prefix) and (p / file).is_file()
            ]
        return sort_versions(name for name in names if _valid_key(name))

    def write(self, table: str, version: str, data: pa.Table) -> Path | str:
        """Write one partition atomically (temp file, then ``os.replace``; on an object store
        one PUT); return its path (a URL string for a URL lake).

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
        if self.fs is not None:
            written = self._write_remote(target, data)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
            try:
                pq.write_table(data, tmp, compression="zstd")
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            written = target
        self._move_old_charts(table, version)
        return written

    def _move_old_charts(self, table: str, version: str) -> None:
        """Lakes written before charts had their own folder kept them in the partition's
        directory, where they break every Parquet reader of the table: move them out."""
        directory, charts = self.partition_dir(table, version), self.chart_dir(version)
        if self.fs is not None:
            for path in self.fs.glob(f"{directory}/*.png"):
                self.fs.mv(path, f"{charts}/{path.rsplit('/', 1)[-1]}")
            return
        for path in directory.glob("*.png"):
            charts.mkdir(parents=True, exist_ok=True)
            os.replace(path, charts / path.name)

    def chart_dir(self, version: str) -> Path | str:
        """``<lake>/charts/policy_version=<key>``: where :meth:`write_chart` puts ``version``'s
        charts, outside every table's directory."""
        return self._join(CHARTS_DIR, f"{PARTITION_COLUMN}={check_version_key(version)}")

    def write_chart(self, version: str, name: str, data: bytes) -> Path | str:
        """Write one chart of ``version`` (PNG bytes; ``name`` a plain file name such as
        ``time_share.png``) into :meth:`chart_dir`, atomically like :meth:`write`; return its
        path (a URL string for a URL lake). ``ValueError`` for a name with ``/`` or a
        ``.parquet`` name (tables are written with :meth:`write`)."""
        if not name or "/" in name or name.startswith(".") or name.endswith(".parquet"):
            raise ValueError(f"lake.write_chart: {name!r} must be a plain, non-Parquet file name")
        directory = self.chart_dir(version)
        if self.fs is not None:
            target = f"{directory}/{name}"
            self.fs.pipe_file(target, data)  # one PUT: atomic on object stores
            return target
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / name
        tmp = directory / f".{name}.{uuid.uuid4().hex}.tmp"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target

    def _write_remote(self, target: str, data: pa.Table) -> str:
        """The file is encoded in memory first (a failed encode writes nothing), then sent as
        one object store PUT (atomic); elsewhere as a temp object, then ``mv``."""
        sink = pa.BufferOutputStream()
        pq.write_table(data, sink, compression="zstd")
        payload = sink.getvalue().to_pybytes()
        protocol = self.root.split("://", 1)[0]
        if protocol in OBJECT_STORES:
            self.fs.pipe_file(target, payload)
            return target
        tmp = target.rsplit("/", 1)[0] + f"/.{PART_FILE}.{uuid.uuid4().hex}.tmp"
        try:
            self.fs.pipe_file(tmp, payload)
            self.fs.mv(tmp, target)
        finally:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)
        return target

    def read(self, table: str, version: str) -> pa.Table:
        """One partition as Arrow; ``FileNotFoundError`` when it was never written."""
        path = self.partition_file(table, version)
        if self.fs is not None:
            if not self.fs.exists(path):
                raise FileNotFoundError(
                    f"lake: no {table} partition for policy_version {version!r} at {path}"
                )
            with self.fs.open(path, "rb") as fh:
                return pq.read_table(fh)
        if not path.is_file():
            raise FileNotFoundError(
                f"lake: no {table} partition for policy_version {version!r} at {path}"
            )
        return pq.read_table(path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with open(self.cache_dir / LOCK_FILE, "a+b") as fh:
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
            pattern = str(self._join(table, "*", "*.parquet")).replace("'", "''")
            statements[table] = (
                # policy_version comes from the files, never from folder names (module doc)
                f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{pattern}', "
                "hive_partitioning = false, union_by_name = true)"
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
            tmp = self.cache_dir / f".{DUCKDB_FILE}.{uuid.uuid4().hex}.tmp"
            try:
                con = duckdb.connect(
                    str(tmp), config={"storage_compatibility_version": STORAGE_COMPATIBILITY}
                )
                try:
                    if self.fs is not None:  # views over URLs bind through fsspec
                        con.register_filesystem(self.fs)
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

    def connect(self, *, parquet: bool = False) -> duckdb.DuckDBPyConnection:
        """A read-only connection to ``legato.duckdb`` (any number of readers at once).

        Raises ``FileNotFoundError`` before the first materialization built it, and
        :class:`LakeLockedError` when another process holds the file read-write (module doc).
        A URL lake builds this host's views file on first use (the data is in the lake, not
        here). ``parquet=True``: no file at all, the same views (:meth:`view_sql`) in an
        in-memory database over the Parquet files; works while the file is locked or missing.
        """
        if parquet:
            con = duckdb.connect()
            try:
                if self.fs is not None:
                    self.fs.invalidate_cache()
                    con.register_filesystem(self.fs)
                for sql in self.view_sql().values():
                    con.execute(sql)
            except BaseException:
                con.close()
                raise
            return con
        if self.fs is not None and not self.duckdb_path.is_file():
            self.refresh_views()
        if not self.duckdb_path.is_file():
            raise FileNotFoundError(
                f"lake: {self.duckdb_path} does not exist yet (materialize a partition first)"
            )
        try:
            con = duckdb.connect(str(self.duckdb_path), read_only=True)
        except duckdb.Error as exc:
            locked = _locked_message(self.duckdb_path, exc)
            if locked is None:
                raise
            raise locked from None
        if self.fs is not None:
            self.fs.invalidate_cache()
            con.register_filesystem(self.fs)
        return con

    def query(self, sql: str, params: list | None = None, *, parquet: bool = False) -> pa.Table:
        """Run one SQL query on the views (read-only) and return the result as Arrow.
        ``parquet``: as :meth:`connect`'s. Raises what :meth:`connect` raises, and
        ``duckdb.Error`` for bad SQL."""
        con = self.connect(parquet=parquet)
        try:
            return con.sql(sql, params=params).to_arrow_table()
        finally:
            con.close()

    def dataset(self, table: str, versions: Iterable[str] | None = None) -> ds.Dataset:
        """A pyarrow dataset over ``table``'s partitions (all, or those of ``versions``) with
        the union schema of every file (module doc): today's schema of the table first, then
        any column only older or newer files hold; a column a file lacks reads as null.

        ``ConfigError`` for an unknown table or version key; ``FileNotFoundError`` when a
        version named in ``versions`` has no partition of ``table``. An empty dataset (no
        partition) has today's schema."""
        if table not in TABLES:
            raise ConfigError(f"lake: unknown table {table!r} (one of {', '.join(TABLES)})")
        held = self.versions(table)
        names = held if versions is None else [check_version_key(v) for v in versions]
        missing = [v for v in names if v not in held]
        if missing:
            raise FileNotFoundError(
                f"lake: no {table} partition for policy_version {', '.join(map(repr, missing))} "
                f"in {self.root} (`legato lake views` lists what it holds)"
            )
        files = [str(self.partition_file(table, v)) for v in names]
        if self.fs is not None:
            files = [self.fs._strip_protocol(f) for f in files]
        options = {"format": "parquet", "filesystem": self.fs} if self.fs else {"format": "parquet"}
        found = ds.dataset(files, **options)
        schemas = [known_schema(table)] + [f.physical_schema for f in found.get_fragments()]
        schema = pa.unify_schemas(schemas, promote_options="permissive")
        return ds.dataset(files, schema=schema, **options)

    def read_all(
        self, table: str, versions: Iterable[str] | None = None, filter: ds.Expression | None = None
    ) -> pa.Table:
        """``table``'s rows of every version (or of ``versions``) as one Arrow table with the
        union schema (:meth:`dataset`); ``filter`` a pyarrow expression
        (``ds.field("logprobs_valid")``)."""
        return self.dataset(table, versions).to_table(filter=filter)

    def drop(self, version: str, *, run: bool = False) -> list[str]:
        """Remove ``version`` from the lake: its partition of every table and its charts (with
        ``run``, its run directory too, the records it was built from; a URL lake's local
        copy as well), then rebuild the views; return what was removed (paths).

        Under the lake's lock, so no view rebuild runs half-way through it. Dagster's record
        of the partition's materializations is Dagster's: delete the partition there
        (``dagster instance`` / the UI) if it should go too. ``ConfigError`` for an invalid key.
        """
        key = check_version_key(version)
        places = [self.partition_dir(t, key) for t in TABLES] + [self.chart_dir(key)]
        if run:
            places.append(self.run_location(key))
            if self.fs is not None:
                places.append(self.run_dir(key))
        removed: list[str] = []
        with self._locked():
            for place in places:
                if self.fs is not None and isinstance(place, str):
                    self.fs.invalidate_cache()
                    if self.fs.exists(place):
                        self.fs.rm(place, recursive=True)
                        removed.append(place)
                elif Path(place).exists():
                    shutil.rmtree(place)
                    removed.append(str(place))
        self.refresh_views()
        return removed


def known_schema(table: str) -> pa.Schema:
    """Today's schema of a lake table (``samples``: the step export's and the lineage's)."""
    from .lake_tables import PROFILE_SCHEMA, ROLLOUTS_SCHEMA, STEPS_SCHEMA, samples_schema

    if table == "samples":
        return samples_schema()
    return {"rollouts": ROLLOUTS_SCHEMA, "steps": STEPS_SCHEMA, "profile": PROFILE_SCHEMA}[table]


def read_table(
    lake: str | Path | Lake,
    table: str,
    versions: Iterable[str] | None = None,
    filter: ds.Expression | None = None,
) -> pa.Table:
    """Read a lake table across versions of the project: :meth:`Lake.read_all` of ``lake``
    (a root directory, an fsspec URL, or a :class:`Lake`). Every column any partition holds is
    there (null where a file lacks it), unlike ``ds.dataset(folder)`` and
    ``pd.read_parquet(folder)``, which keep the first file's columns only."""
    store = lake if isinstance(lake, Lake) else Lake(lake)
    return store.read_all(table, versions, filter)


def read_samples(
    lake: str | Path | Lake,
    versions: Iterable[str] | None = None,
    filter: ds.Expression | None = None,
) -> pa.Table:
    """The ``samples`` table (training rows) of ``versions`` (default: all) with every column
    of every version of the project: :func:`read_table` of ``samples``. ``.to_pandas()`` for
    a DataFrame; ``filter`` e.g. ``ds.field("logprobs_valid") & ds.field("group_complete")``."""
    return read_table(lake, "samples", versions, filter)
