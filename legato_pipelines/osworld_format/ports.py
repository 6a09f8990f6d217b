"""OSWorld's fixed desktop ports, and what a local desktop's network does to tasks using them.

An OSWorld VM exposes two ports besides its server: Chrome's DevTools protocol on 9222 (the
configs start ``google-chrome --remote-debugging-port=1337`` and bridge it with ``socat
tcp-listen:9222,fork tcp:localhost:1337``) and VLC's HTTP interface on 8080. DesktopEnv
reaches them from the host side as ``chromium_port`` / ``vlc_port``: in desktop-env 1.0.2
the setup steps ``chrome_open_tabs``, ``chrome_close_tabs`` and ``login`` and the getters
below (the functions of ``evaluators/getters/chrome.py`` and ``vlc.py`` that use those ports).

On a local desktop (docs/local-desktop.md §12) the desktop option ``network`` decides where
those ports are: ``auto`` (the default) is ``own`` for a batch holding such a task
(``desktops/network.py``); ``host`` shares the host's ports among all desktops, so only
one desktop at a time can hold 9222/1337/8080 and with two desktops or more one desktop's
setup or grader can reach another's browser; ``none`` gives each desktop a loopback of its
own that nothing outside reaches (so the grader reaches no port at all); ``own`` forwards
per-desktop host ports (passt's ``pasta``), handed to the grader: everything works.
"""

from __future__ import annotations

from typing import Any

from ..tasks import Task
from .files import evaluator_getters

#: OSWorld's ports on the desktop (``chromium_port``, ``vlc_port``) and what listens there.
CHROME_PORT, VLC_PORT = 9222, 8080
PORT_NAMES = {CHROME_PORT: "Chrome's DevTools port 9222", VLC_PORT: "VLC's HTTP port 8080"}

#: Setup steps DesktopEnv's SetupController runs over Chrome's DevTools port (playwright).
CHROME_PORT_STEPS = frozenset({"chrome_open_tabs", "chrome_close_tabs", "login"})
#: Getters that reach a port from the host side, per port (desktop-env 1.0.2).
PORT_GETTERS: dict[int, frozenset[str]] = {
    CHROME_PORT: frozenset(
        {
            "info_from_website",
            "page_info",
            "open_tabs_info",
            "active_tab_info",
            "pdf_from_url",
            "chrome_saved_address",
            "number_of_search_results",
            "active_tab_html_parse",
            "gotoRecreationPage_and_get_html_content",
        }
    ),
    VLC_PORT: frozenset({"vlc_playing_info"}),
}
#: Apps whose start (as OSWorld's configs and the local desktops' profiles do it) holds a port.
PORT_APPS = {"chrome": CHROME_PORT, "vlc": VLC_PORT}

NETWORKS = ("host", "none", "own")


def held_ports(apps: list[str]) -> list[int]:
    """The OSWorld ports a task's ``apps`` hold on the desktop's network (9222 for Chrome,
    8080 for VLC), in first-seen order."""
    return list(dict.fromkeys(PORT_APPS[a] for a in apps if a in PORT_APPS))


def grader_port_parts(task: Task) -> list[tuple[str, int]]:
    """The parts of ``task`` that reach a desktop port from outside the desktop (DesktopEnv's
    side), as ``(what, port)``: ``("setup step chrome_open_tabs", 9222)``,
    ``("getter open_tabs_info", 9222)``. Setup and postconfig steps, then getters."""
    steps: list[Any] = list(task.setup) + list(task.evaluator.get("postconfig") or [])
    parts = [
        (f"setup step {s.get('type')}", CHROME_PORT)
        for s in steps
        if isinstance(s, dict) and s.get("type") in CHROME_PORT_STEPS
    ]
    for getter in evaluator_getters(task.evaluator):
        for port, names in PORT_GETTERS.items():
            if getter.get("type") in names:
                parts.append((f"getter {getter['type']}", port))
    return list(dict.fromkeys(parts))


def network_problems(parts: list[tuple[str, int]], network: str | None, desktops: int) -> list[str]:
    """Why the local desktops' ``network`` (``None``: not known, desktops attached by URL)
    stops a task whose ``parts`` (:func:`grader_port_parts`) reach a desktop port, with
    ``desktops`` desktops open at once. Empty when nothing does."""
    if not parts or network in (None, "own", "auto"):  # auto: own for a task like this
        return []
    what = ", ".join(name for name, _ in parts[:3]) + (" ..." if len(parts) > 3 else "")
    ports = " and ".join(PORT_NAMES[p] for p in dict.fromkeys(port for _, port in parts))
    if network == "none":
        return [
            f"{what} reach {ports} of the desktop from outside it, which desktop option "
            "network=none cuts off (a loopback of its own) (fix: --desktop-option network=own)"
        ]
    if network == "host" and desktops >= 2:
        return [
            f"{what} reach {ports}, which on network=host all {desktops} "
            "desktops share: one desktop's setup or grader would reach another desktop's app "
            "(fix: --desktop-option network=own, per-desktop ports, needs pasta; or one "
            "desktop: --desktops 1 --spares 0)"
        ]
    return []
