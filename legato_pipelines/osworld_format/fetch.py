"""Fill the file cache once: fetch every file a task list references (``legato osworld cache``).

The task runtime never downloads (:mod:`.sources`); this is the one place that does, ahead of
time, so collection then runs offline from the cache. For every web URL that
:func:`.files.task_files` finds (``download`` steps, ``cloud_file`` getters incl. ``multi``) it
writes the file where :func:`.sources.find_source` looks first, under OSWorld's own cache
names in ``<cache_dir>/<task_id>/``: ``<uuid5(NAMESPACE_URL, url)>_<basename(path)>`` for a
``download`` file, ``<basename(dest)>`` for a ``cloud_file`` (an OSWorld ``cache/`` directory
and this one are interchangeable). A URL several tasks (or a download and a getter) share is
fetched once and hard-linked (else copied) to its other names.

- **Skips** a reference :func:`.sources.find_source` already resolves, without a request
  (``verify``: one ``HEAD`` per URL, and a file whose size differs from its Content-Length is
  fetched again).
- **Resumes**: bytes go to ``<name>.part``; an interrupted transfer keeps it, and the next
  attempt (or run) continues it with ``Range: bytes=<size>-``. A server that ignores the range
  (``200``) starts the file over. Only a complete file is renamed to its final name.
- **Checks sizes**: the bytes written must equal the Content-Length (``200``) or the total of
  the Content-Range (``206``); a mismatch is an error for that file and is retried (an early
  end of the connection keeps the ``.part``; a wrong total starts over).
- **Mirrors**: a URL on ``huggingface.co`` is fetched from ``$HF_ENDPOINT`` (as huggingface_hub
  users set it, e.g. ``https://hf-mirror.com``) with the same path; cache names always come
  from the URL as the task gives it.
- Runs ``jobs`` transfers at once (asyncio + one ``httpx.AsyncClient``, redirects followed,
  the environment's proxy settings honoured); a failed file never stops the others.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal, Protocol, TypeVar
from urllib.parse import urlparse

import httpx
from pydantic import BaseModel, ConfigDict, Field

from ..tasks import Task
from .files import TaskFile, task_files
from .sources import cache_names, find_source, is_internet_url

HUB_HOST = "huggingface.co"
ENDPOINT_ENV = "HF_ENDPOINT"
DEFAULT_JOBS = 4
# Answers that another attempt will not change.
PERMANENT_STATUS = frozenset({400, 401, 403, 404, 405, 410, 451})
T = TypeVar("T")
_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)", re.IGNORECASE)


def fetch_url(url: str, endpoint: str | None) -> str:
    """The URL to request for ``url``: on ``huggingface.co`` and with ``endpoint`` (a mirror
    such as ``https://hf-mirror.com``, optionally with a path prefix) the same path and query on
    the endpoint; otherwise ``url`` itself."""
    if not endpoint:
        return url
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or parsed.hostname != HUB_HOST:
        return url
    query = f"?{parsed.query}" if parsed.query else ""
    return f"{endpoint.rstrip('/')}{parsed.path}{query}"


def cache_file_name(file: TaskFile) -> str:
    """The name OSWorld gives ``file`` in its per-task cache directory (and the first that
    :func:`.sources.find_source` tries): ``<uuid5(url)>_<basename(path)>`` for a download,
    ``<basename(dest)>`` for a ``cloud_file``, the URL's own file name when there is no dest."""
    names = cache_names(file.url, file.dest)
    if file.kind == "cloud_file" and file.dest:
        return PurePosixPath(file.dest).name
    return names[0] if names else "file"


class CacheSettings(BaseModel):
    """How :func:`fill_cache` fetches.

    ``cache_dir``: the file cache (created when missing); ``jobs``: transfers at once;
    ``attempts``: tries per file (a dropped connection, a 5xx answer or a size mismatch is
    tried again; 4xx answers like 404 are not); ``retry_wait_s``: seconds before the second
    attempt, doubled each time; ``timeout_s``: seconds a connect or a read may take;
    ``verify``: ``HEAD`` every URL whose file is present and fetch it again when its size
    differs; ``endpoint``: the hub mirror (``None``: ``$HF_ENDPOINT``, else huggingface.co itself).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cache_dir: Path
    jobs: int = Field(DEFAULT_JOBS, ge=1, le=64)
    attempts: int = Field(3, ge=1, le=20)
    retry_wait_s: float = Field(1.0, ge=0)
    timeout_s: float = Field(60.0, gt=0)
    verify: bool = False
    endpoint: str | None = None

    def hub_endpoint(self) -> str | None:
        """``endpoint``, else ``$HF_ENDPOINT``, else ``None`` (fetch from the URL's own host)."""
        return self.endpoint or os.environ.get(ENDPOINT_ENV) or None


Status = Literal["fetched", "present", "failed"]


class FileResult(BaseModel):
    """What happened to one URL.

    ``status``: ``fetched`` (downloaded this run), ``present`` (already in the cache: no GET),
    ``failed`` (``error`` says why). ``paths``: the cache files holding it (absolute);
    ``size``: its size in bytes (``None`` when unknown); ``downloaded``: bytes received this
    run; ``refs``: ``<task_id> <field>`` of every reference to it.
    """

    url: str
    fetched_from: str
    status: Status
    paths: list[str]
    size: int | None = None
    downloaded: int = 0
    error: str | None = None
    refs: list[str]


class CacheReport(BaseModel):
    """The results of :func:`fill_cache`, one per URL, in first-reference order."""

    cache_dir: str
    files: list[FileResult]

    def count(self, status: Status) -> int:
        """How many URLs ended with ``status``."""
        return sum(f.status == status for f in self.files)

    @property
    def failed(self) -> list[FileResult]:
        return [f for f in self.files if f.status == "failed"]

    @property
    def downloaded(self) -> int:
        """Bytes received this run, over all files (retries included)."""
        return sum(f.downloaded for f in self.files)

    def summary(self) -> str:
        """One line: files fetched / already present / failed, and the bytes."""
        fetched = [f for f in self.files if f.status == "fetched"]
        size = sum(f.size or 0 for f in fetched)
        return (
            f"{len(fetched)} fetched ({format_bytes(size)}, {format_bytes(self.downloaded)} "
            f"received), {self.count('present')} already present, {self.count('failed')} failed "
            f"of {len(self.files)} file(s); cache {self.cache_dir}"
        )


def format_bytes(n: int) -> str:
    """``n`` bytes as ``512 B`` / ``1.5 kB`` / ``2.0 MB`` / ``1.1 GB`` (powers of 1000)."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"  # pragma: no cover


class FetchProgress(Protocol):
    """What :func:`fill_cache` reports while it works (the CLI draws a rich progress bar)."""

    def planned(self, files: int) -> None:
        """``files``: how many URLs will be fetched (or checked, with ``verify``)."""

    def expect(self, nbytes: int) -> None:
        """The expected total grew by ``nbytes`` (a Content-Length became known; may be < 0)."""

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more are on disk (< 0: a partial file was discarded)."""

    def done(self, result: FileResult) -> None:
        """One URL is finished (any status)."""


@dataclass
class _Entry:
    """One URL and every place the cache should hold it."""

    url: str
    refs: list[str] = field(default_factory=list)
    present: list[Path] = field(default_factory=list)  # found by find_source
    missing: list[Path] = field(default_factory=list)  # where to put it


class _Retry(Exception):
    """This attempt failed; another may succeed."""


class _Permanent(Exception):
    """Another attempt would fail the same way."""


def plan(tasks: Iterable[Task], cache_dir: Path) -> list[_Entry]:
    """Group the web URLs of ``tasks`` (``file://`` URLs and local paths are skipped) by URL,
    with the cache files already resolving each reference and the ones still missing."""
    entries: dict[str, _Entry] = {}
    for task in tasks:
        for file in task_files(task):
            if not is_internet_url(file.url):
                continue
            entry = entries.setdefault(file.url, _Entry(file.url))
            entry.refs.append(f"{task.task_id} {file.field}")
            found = find_source(file.url, dest=file.dest, cache_dir=cache_dir, task_id=task.task_id)
            if found is not None:
                if found not in entry.present:
                    entry.present.append(found)
                continue
            target = cache_dir / task.task_id / cache_file_name(file)
            if target not in entry.missing:
                entry.missing.append(target)
    return list(entries.values())


def _part(path: Path) -> Path:
    return path.with_name(path.name + ".part")


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """``(start, total)`` of a Content-Range header (``None`` for what it does not give)."""
    match = _CONTENT_RANGE.search(value or "")
    if not match:
        return None, None
    start = int(match.group(1)) if match.group(1) else None
    total = int(match.group(3)) if match.group(3) != "*" else None
    return start, total


def _content_length(response: httpx.Response) -> int | None:
    try:
        return int(response.headers["content-length"])
    except (KeyError, ValueError):
        return None


def _place(source: Path, target: Path) -> None:
    """Give ``target`` the bytes of ``source``: a hard link, else a copy (atomic replace)."""
    if target == source:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


class _Transfer:
    """One URL's download into ``dest`` (through ``dest.part``), retried and resumed."""

    def __init__(self, client: httpx.AsyncClient, url: str, dest: Path, progress: FetchProgress):
        self.client, self.url, self.dest, self.progress = client, url, dest, progress
        self.part = _part(dest)
        self.total: int | None = None  # expected size, as reported to progress
        self.on_disk = 0  # bytes of .part reported to progress
        self.downloaded = 0

    def _expect(self, total: int | None) -> None:
        if total is not None and total != self.total:
            self.progress.expect(total - (self.total or 0))
            self.total = total

    def _discard(self) -> None:
        self.part.unlink(missing_ok=True)
        self.progress.advance(-self.on_disk)
        self.on_disk = 0

    async def attempt(self) -> None:
        """One GET; raises :class:`_Retry` / :class:`_Permanent`; returns with ``.part`` complete."""
        offset = self.part.stat().st_size if self.part.is_file() else 0
        if offset != self.on_disk:  # a .part left by an earlier run counts as done
            self.progress.advance(offset - self.on_disk)
            self.on_disk = offset
        headers = {"Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        async with self.client.stream("GET", self.url, headers=headers) as response:
            code = response.status_code
            if code == 416 and offset:
                _, total = _content_range(response.headers.get("content-range"))
                if total == offset:
                    self._expect(total)
                    return  # the .part is already the whole file
                self._discard()
                raise _Retry(
                    f"the server cannot continue at byte {offset} (HTTP 416, it has "
                    f"{total if total is not None else 'an unknown number of'} bytes): starting over"
                )
            if code == 206 and offset:
                start, total = _content_range(response.headers.get("content-range"))
                if start != offset:
                    self._discard()
                    raise _Retry(f"the server answered the range from byte {start}: starting over")
                mode = "ab"
                what = "Content-Range"
            elif code == 200:
                if offset:  # the server ignored the Range header: the whole file again
                    self._discard()
                    offset = 0
                total = _content_length(response)
                mode = "wb"
                what = "Content-Length"
            elif code in PERMANENT_STATUS:
                raise _Permanent(f"HTTP {code} {response.reason_phrase}".rstrip())
            else:
                raise _Retry(f"HTTP {code} {response.reason_phrase}".rstrip())
            self._expect(total)
            written = offset
            self.part.parent.mkdir(parents=True, exist_ok=True)
            with open(self.part, mode) as fh:
                try:
                    async for chunk in response.aiter_raw():  # as it arrives: none lost on a drop
                        fh.write(chunk)
                        written += len(chunk)
                        self.downloaded += len(chunk)
                        self.on_disk = written
                        self.progress.advance(len(chunk))
                except httpx.TransportError as exc:
                    fh.flush()
                    got = (
                        f"size mismatch: got {written} of {total} bytes ({what})"
                        if total is not None
                        else f"got {written} bytes"
                    )
                    raise _Retry(
                        f"{got} before the transfer broke off ({type(exc).__name__}); "
                        f"{self.part.name} is kept to resume"
                    ) from None
        if total is not None and written != total:
            self._discard()
            raise _Retry(
                f"size mismatch: the server announced {total} bytes ({what}), "
                f"{written} were written; starting over"
            )
        self._expect(written)


async def _head_size(client: httpx.AsyncClient, url: str) -> int | None:
    """The Content-Length a ``HEAD`` answers (redirects followed), ``None`` when it gives none."""
    response = await client.head(url, headers={"Accept-Encoding": "identity"})
    if response.status_code in PERMANENT_STATUS:
        raise _Permanent(f"HEAD: HTTP {response.status_code} {response.reason_phrase}".rstrip())
    if response.status_code >= 400:
        raise _Retry(f"HEAD: HTTP {response.status_code} {response.reason_phrase}".rstrip())
    return _content_length(response)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (_Retry, _Permanent)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _retrying(settings: CacheSettings, call: Callable[[], Awaitable[T]]) -> T:
    """``await call()``, up to ``settings.attempts`` times (waiting ``retry_wait_s``, doubled
    each time, in between); raises the last failure as :class:`_Permanent`."""
    wait = settings.retry_wait_s
    last = ""
    for attempt in range(1, settings.attempts + 1):
        try:
            return await call()
        except _Permanent:
            raise
        except (_Retry, httpx.TransportError, OSError) as exc:
            last = _describe(exc)
        if attempt < settings.attempts:
            await asyncio.sleep(wait)
            wait *= 2
    raise _Permanent(f"{last} (after {settings.attempts} attempts)")


async def _one(
    client: httpx.AsyncClient, entry: _Entry, settings: CacheSettings, progress: FetchProgress
) -> FileResult:
    """Bring one URL into the cache: place, verify or fetch it. Never raises for the URL."""
    source = fetch_url(entry.url, settings.hub_endpoint())
    present, missing = list(entry.present), list(entry.missing)
    status: Status = "present"
    error: str | None = None
    downloaded = 0
    try:
        if urlparse(source).scheme not in ("http", "https"):
            if missing:
                raise _Permanent("not an http(s) URL (only those are fetched)")
        elif settings.verify and present:
            size = await _retrying(settings, lambda: _head_size(client, source))
            if size is not None:
                wrong = [p for p in present if p.stat().st_size != size]
                present = [p for p in present if p not in wrong]
                missing = wrong + missing  # fetched again, in place
        if missing and present:  # another task's copy, or another name of it, is here
            for target in missing:
                _place(present[0], target)
            present, missing = present + missing, []
        if missing:
            # Continue the largest .part any of its names left behind.
            missing.sort(key=lambda p: -(_part(p).stat().st_size if _part(p).is_file() else 0))
            dest = missing[0]
            transfer = _Transfer(client, source, dest, progress)
            try:
                await _retrying(settings, transfer.attempt)
            finally:
                downloaded = transfer.downloaded
            os.replace(transfer.part, dest)
            for target in missing[1:]:
                _place(dest, target)
            status, present, missing = "fetched", present + missing, []
    except _Permanent as exc:
        status, error = "failed", str(exc)
    except (
        httpx.HTTPError,
        httpx.InvalidURL,
        OSError,
    ) as exc:  # e.g. too many redirects, disk full
        status, error = "failed", _describe(exc)
    return FileResult(
        url=entry.url,
        fetched_from=source,
        status=status,
        paths=[str(p) for p in (entry.missing if status == "failed" else present)],
        size=present[0].stat().st_size if present and status != "failed" else None,
        downloaded=downloaded,
        error=error,
        refs=entry.refs,
    )


class _NoProgress:
    def planned(self, files: int) -> None: ...
    def expect(self, nbytes: int) -> None: ...
    def advance(self, nbytes: int) -> None: ...
    def done(self, result: FileResult) -> None: ...


async def fill_cache(
    tasks: Iterable[Task],
    settings: CacheSettings,
    *,
    progress: FetchProgress | None = None,
) -> CacheReport:
    """Fetch every web file ``tasks`` reference into ``settings.cache_dir`` (see the module doc).

    Returns one :class:`FileResult` per URL; never raises for a file that cannot be fetched
    (its result says why); ``progress`` hears of every byte and file. Raises ``OSError`` only
    when ``cache_dir`` cannot be created.
    """
    progress = progress or _NoProgress()
    cache_dir = Path(settings.cache_dir).expanduser().resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    entries = plan(tasks, cache_dir)
    work = [e for e in entries if e.missing or settings.verify]
    progress.planned(len(work))
    results: dict[str, FileResult] = {}
    for entry in entries:
        if entry not in work:
            results[entry.url] = FileResult(
                url=entry.url,
                fetched_from=fetch_url(entry.url, settings.hub_endpoint()),
                status="present",
                paths=[str(p) for p in entry.present],
                size=entry.present[0].stat().st_size,
                refs=entry.refs,
            )
    if work:
        limit = asyncio.Semaphore(settings.jobs)
        timeout = httpx.Timeout(settings.timeout_s)
        async with httpx.AsyncClient(
            follow_redirects=True,
            timeout=timeout,
            limits=httpx.Limits(max_connections=settings.jobs),
        ) as client:

            async def run(entry: _Entry) -> None:
                async with limit:
                    result = await _one(client, entry, settings, progress)
                results[entry.url] = result
                progress.done(result)

            await asyncio.gather(*(run(e) for e in work))
    return CacheReport(cache_dir=str(cache_dir), files=[results[e.url] for e in entries])
