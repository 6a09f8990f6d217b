"""Where the bytes of a task file come from: ``file://`` URLs or a local file cache, never the web.

OSWorld's host downloads every ``download`` / ``cloud_file`` URL (all on huggingface.co) into
``cache/<task_id>/`` and reuses it. Here nothing is downloaded: a URL resolves to

1. the file itself for ``file:///abs/path`` (or a bare absolute path);
2. else a file in the cache directory, looked up in ``<cache>/<task_id>/`` then ``<cache>/`` under
   OSWorld's own cache names, so an OSWorld ``cache/`` directory works as is:
   ``<uuid5(NAMESPACE_URL, url)>_<basename(dest)>`` (setup downloads) and ``<dest>`` (evaluator
   ``cloud_file``), then the URL's own file name (``basename(urlpath)``);
3. else :class:`UnsupportedStep` naming the URL (it would need the internet).

``legato osworld cache`` (:mod:`.fetch`) fills a cache ahead of time under OSWorld's names in
``<cache>/<task_id>/`` (docs/osworld.md §10).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

from ..errors import ConfigError
from ..user_cache import legato_cache
from .unsupported import UnsupportedStep


def default_cache_dir() -> Path:
    """The default file cache: ``$XDG_CACHE_HOME/legato/osworld-files`` (else
    ``~/.cache/legato/osworld-files``). ``legato osworld cache`` fills it when given no
    ``--cache-dir``, and the local backend, ``legato tasks check`` and ``legato collect`` read
    it when given no ``cache_dir`` (:func:`file_cache_dir`): the one place it is defined."""
    return legato_cache("osworld-files")


def file_cache_dir(options: Mapping[str, Any]) -> Path | None:
    """The read-only file cache of desktop ``options``: option ``cache_dir`` when given
    (:func:`cache_dir_path`; ``""`` or ``null``: no file cache at all), else
    :func:`default_cache_dir`, where ``legato osworld cache`` puts the files by default. A
    directory that does not exist simply holds no file. Raises ``ConfigError`` as
    :func:`cache_dir_path`."""
    if "cache_dir" not in options:
        return default_cache_dir()
    return cache_dir_path(options["cache_dir"])


def cache_dir_path(value: Any) -> Path | None:
    """The file cache directory a ``cache_dir`` option names, as a ``Path`` with ``~`` expanded;
    ``None`` when unset (``None`` or ``""``).

    The option arrives as a ``str`` whatever its spelling (``--desktop-option cache_dir=/c``,
    ``cache_dir='"/c"'``, JSON in ``LEGATO_BACKEND_OPTIONS``) or as a ``Path``; every consumer
    (setup, getters, preflight) goes through here, so none of them meets a bare ``str``.
    Raises ``ConfigError`` naming the option when ``value`` is not a path (a number, a list).
    """
    if value is None or value == "":
        return None
    if isinstance(value, str | os.PathLike):
        return Path(value).expanduser()
    raise ConfigError(
        f"desktop option 'cache_dir' must be a directory path, got {value!r} "
        "(fix: --desktop-option cache_dir=/path/to/cache)"
    )


def local_url_path(url: str) -> Path | None:
    """The local path of a ``file://`` URL or a bare absolute path, else ``None``."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if not parsed.scheme and url.startswith("/"):
        return Path(url)
    return None


def is_internet_url(url: str) -> bool:
    """True for URLs only the network can serve (not ``file://``, not a local path)."""
    return local_url_path(url) is None


def cache_names(url: str, dest: str | None) -> list[str]:
    """The file names a cached copy of ``url`` may have, most specific first (OSWorld's first)."""
    names: list[str] = []
    if dest:
        names.append(f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{PurePosixPath(dest).name}")
        names.append(PurePosixPath(dest).name)
    url_name = PurePosixPath(unquote(urlparse(url).path)).name
    if url_name:
        names.append(url_name)
    return list(dict.fromkeys(names))


def find_source(
    url: str, *, dest: str | None, cache_dir: Path | None, task_id: str | None
) -> Path | None:
    """The local file holding ``url``'s bytes, or ``None`` (no error) when there is none.

    ``dest`` is the target path or file name the task gives the file (used for OSWorld's cache
    names). A ``file://`` URL whose file is missing gives ``None`` as well.
    """
    local = local_url_path(url)
    if local is not None:
        return local if local.is_file() else None
    if cache_dir is None:
        return None
    roots = [Path(cache_dir) / task_id] if task_id else []
    roots.append(Path(cache_dir))
    for root in roots:
        for name in cache_names(url, dest):
            candidate = root / name
            if candidate.is_file():
                return candidate
    return None


def resolve_source(
    url: str, *, dest: str | None, cache_dir: Path | None, task_id: str | None, step_type: str
) -> Path:
    """Like :func:`find_source`, but raise when the file is not available locally.

    Raises :class:`UnsupportedStep` (``step_type`` names the step or getter) for an internet URL
    that is not cached, and ``FileNotFoundError`` for a ``file://`` URL whose file is missing.
    """
    found = find_source(url, dest=dest, cache_dir=cache_dir, task_id=task_id)
    if found is not None:
        return found
    local = local_url_path(url)
    if local is not None:
        raise FileNotFoundError(f"{step_type}: {url} does not exist")
    where = (
        f" or in the file cache {cache_dir} (names tried: {', '.join(cache_names(url, dest))})"
        if cache_dir
        else ""
    )
    raise UnsupportedStep(
        f"{step_type}: {url} needs the internet (not a file:// URL{where}); "
        "fix: fetch it with `legato osworld cache TASKS`, into its default directory, which collect and tasks check read when given no cache, or into DIR passed as `--desktop-option cache_dir=DIR` / `legato tasks check --cache-dir DIR`; or run the task on the osworld backend",
        step_type=step_type,
        urls=[url],
    )
