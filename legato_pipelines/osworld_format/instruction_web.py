"""The web resources a task's instruction sends the agent to: one rule, read by the verdict.

A task whose ``config`` names no URL may still need a live website: its *instruction* tells the
agent to go there ("clone the repo https://github.com/...", "measure my network through
speedtest.net", "install Orchis theme from gnome-look.org"). A desktop without the internet
sets such a task up and grades it, but no policy can solve it, so the verdict counts it as
needing the internet (:func:`~.classify.classify_task`).

The rule is deliberately conservative, so that it never refuses a task for a word: it reads
**explicit web addresses only**,

- a URL with a scheme, ``http://`` or ``https://`` (trailing punctuation of the sentence
  dropped; loopback hosts, ``localhost`` / ``127.0.0.1`` / ``0.0.0.0`` / ``[::1]``, are this
  machine's and left out);
- a bare domain name ending in one of :data:`WEB_SUFFIXES` (``speedtest.net``,
  ``academicpages.github.io``, ``www.example.com``), but not inside an e-mail address
  (``anonym-x2024@outlook.com`` is an account to type into Thunderbird, not a site to visit)
  nor inside a path or a longer name (``/home/user/site.com.txt``).

Words such as "website", "online" or "the internet" are not read: of OSWorld's 369
instructions they occur in Chrome settings tasks ("warn me about unsafe websites", "my online
privacy") that need no site at all, while every instruction that does send the agent to a site
names it (tests/data/osworld: 11 instructions, tests/test_instruction_web.py).
"""

from __future__ import annotations

import re

#: Top-level domains read as a website in a bare domain name (a file name rarely ends so).
WEB_SUFFIXES = ("com", "org", "net", "edu", "gov", "io")

_URL = re.compile(r"\bhttps?://[^\s'\"<>`]+", re.IGNORECASE)
_DOMAIN = re.compile(
    r"(?<![@\w./~-])"  # not inside an e-mail address, a path or a longer name
    r"(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+"
    rf"(?:{'|'.join(WEB_SUFFIXES)})\b"
    r"(?![\w@/-]|\.\w)",  # not followed by more of a name, an address or a path
    re.IGNORECASE,
)
_TRAILING = ".,;:!?)]}'\""
_LOOPBACK = ("localhost", "127.0.0.1", "0.0.0.0", "[::1]")


def instruction_websites(instruction: str) -> list[str]:
    """The web addresses ``instruction`` names, each once in order of appearance: URLs as
    written (without a sentence's trailing punctuation), bare domains as written (module
    docstring for the rule). Loopback URLs are left out. ``[]`` for a non-string or an
    instruction that names none."""
    if not isinstance(instruction, str):
        return []
    found: list[str] = []
    for match in _URL.finditer(instruction):
        url = match.group(0).rstrip(_TRAILING)
        host = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].lower()
        name = host.split("]", 1)[0] + "]" if host.startswith("[") else host.rsplit(":", 1)[0]
        if name and name not in _LOOPBACK:
            found.append(url)
    rest = _URL.sub(" ", instruction)
    found += [m.group(0) for m in _DOMAIN.finditer(rest)]
    return list(dict.fromkeys(found))
