"""The default apps of OSWorld's Ubuntu GNOME VM, as a sandboxed desktop's system-wide mime list.

Ubuntu's GNOME session ships ``/usr/share/applications/defaults.list``, a ``[Default
Applications]`` list that makes GNOME's Videos (totem) the player of every video and most audio
types and GNOME's Document Viewer (evince) the opener of PDFs. Debian has no such file: without
it ``xdg-mime query default`` falls back to ``mimeinfo.cache``, whose first entry is an accident
of names (GIMP for ``application/pdf``, VLC for many video types). Two things read it here:

- ``/setup/open_file`` opens a ``.pdf`` with ``xdg-open``, which must start evince as on the
  VM (vlc task 386dbd0e activates the window ``lecture.pdf — <title>`` evince shows);
- OSWorld's getter ``default_video_player`` (``desktop_env/evaluators/getters/vlc.py``) asks
  ``xdg-mime query default video/<type>`` for ~40 video types and returns the most common
  answer, so "make VLC the default video player" (task 937087b6) starts from totem, not VLC.

The user's choices go to ``~/.config/mimeapps.list`` (``xdg-mime default``, GIO's "always use
for this file type"), which ``xdg-mime`` and GIO read before this list, and a reset restores
HOME; so every desktop starts from the VM's defaults. The file lies in every sandbox's seed layer
under ``/usr`` (docs/sandbox.md §2): the host's ``/usr`` is not touched, and an unsandboxed
desktop (``sandbox=false``) keeps the host's defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where Ubuntu has the list (inside the sandbox), relative to ``/``.
DEFAULTS_LIST = "usr/share/applications/defaults.list"
TOTEM = "org.gnome.Totem.desktop"
EVINCE = "org.gnome.Evince.desktop"
#: The video types of Ubuntu's list (22.04/22.10 ship the same), all to totem; OSWorld's getter
#: asks for a subset of them.
VIDEO_TYPES: tuple[str, ...] = (
    "3gpp", "dv", "fli", "flv", "mp2t", "mp4", "mp4v-es", "mpeg", "msvideo", "ogg",
    "quicktime", "vivo", "vnd.divx", "vnd.rn-realvideo", "vnd.vivo", "webm", "x-anim",
    "x-avi", "x-flc", "x-fli", "x-flic", "x-flv", "x-m4v", "x-matroska", "x-mpeg",
    "x-ms-asf", "x-ms-asx", "x-msvideo", "x-ms-wm", "x-ms-wmv", "x-ms-wmx", "x-ms-wvx",
    "x-nsv", "x-ogm+ogg", "x-theora+ogg", "x-totem-stream",
)  # fmt: skip
#: Audio types Ubuntu's list gives totem (its Rhythmbox entries are left out: no Rhythmbox here).
AUDIO_TYPES: tuple[str, ...] = (
    "3gpp", "ac3", "AMR", "AMR-WB", "basic", "midi", "mp4", "mpeg", "mpegurl", "prs.sid",
    "vnd.rn-realaudio", "x-ape", "x-gsm", "x-it", "x-m4a", "x-matroska", "x-mod",
    "x-ms-asf", "x-ms-asx", "x-ms-wax", "x-ms-wma", "x-musepack", "x-pn-aiff", "x-pn-au",
    "x-pn-realaudio", "x-pn-realaudio-plugin", "x-pn-wav", "x-pn-windows-acm", "x-realaudio",
    "x-real-audio", "x-sbc", "x-speex", "x-tta", "x-wav", "x-wavpack", "x-xm",
)  # fmt: skip
#: The defaults (mime type -> desktop file id).
DEFAULTS: dict[str, str] = {
    "application/pdf": EVINCE,
    "application/x-bzpdf": EVINCE,
    "application/x-gzpdf": EVINCE,
    "application/x-xzpdf": EVINCE,
    **{f"video/{t}": TOTEM for t in VIDEO_TYPES},
    **{f"audio/{t}": TOTEM for t in AUDIO_TYPES},
    **{f"x-content/video-{t}": TOTEM for t in ("dvd", "vcd", "svcd")},
}


def defaults_list() -> str:
    """The text of ``defaults.list``: ``[Default Applications]`` and one ``type=app`` a line."""
    return "[Default Applications]\n" + "".join(f"{k}={v}\n" for k, v in DEFAULTS.items())


def write_seed(seed: Path) -> list[str]:
    """Lay ``defaults.list`` into a sandbox's seed directory (``seed/usr/share/applications``),
    replacing what is there; returns the paths written, relative to ``seed``. Directories it
    creates are 0755 (the sandbox user reads them). Raises ``OSError`` when ``seed`` cannot be
    written."""
    path = seed / DEFAULTS_LIST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(defaults_list())
    os.chmod(path, 0o644)
    for directory in ("usr", "usr/share", "usr/share/applications"):
        os.chmod(seed / directory, 0o755)
    return [DEFAULTS_LIST]
