"""The error for a task part this runtime will not run (internet downloads, unknown step types)."""

from __future__ import annotations

from ..errors import DesktopError


class UnsupportedStep(DesktopError):
    """A setup step (or getter) needs something this runtime does not do: reported, not attempted.

    Raised for a ``download`` / ``cloud_file`` URL that is neither ``file://`` nor found in the
    local file cache (the desktop never reaches the internet; all 475 OSWorld download URLs are
    on huggingface.co), and for step types with no local implementation (``chrome_open_tabs``,
    ``googledrive``, ``login``, ...). ``kind`` is ``"unsupported"``; ``step_type`` names the
    step type and ``urls`` the URLs that would need the internet (possibly empty).

    It is a :class:`~legato_pipelines.errors.DesktopError` so the engine records the attempt as
    an ``env`` error; ``legato tasks check`` reports such tasks before any desktop starts.
    """

    def __init__(self, message: str, *, step_type: str, urls: list[str] | None = None):
        super().__init__(message, kind="unsupported")
        self.step_type = step_type
        self.urls = list(urls or [])
