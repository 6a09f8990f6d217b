"""Static analysis of an OSWorld-format task: what running it needs, and which backends can.

Nothing here touches a desktop. :func:`classify_task` reads the task's setup steps, evaluator
(postconfig, getters, metrics) and commands and answers: which step types, which apps, whether
it needs the internet (and which URLs; a website the instruction names counts too:
:mod:`.instruction_web`), whether it changes state outside ``/home/user`` (so a
fast reset cannot undo it: docs/osworld.md §6), whether its evaluator runs locally, and which
backends (``local`` / ``osworld`` / ``fake``) can run it. ``legato tasks check`` prints it.
:func:`~.verdict.preflight` lists, per backend, the problems that make tasks unrunnable there
(a task with such problems is not in its class's ``backends``, :mod:`.problems`).

The outside-HOME verdict is the union of the explicit task list of docs/osworld.md §6 and command
heuristics (``sudo``, ``apt``/``dpkg``, system ``pip install``, ``/tmp``, ``gsettings``/``dconf``,
``timedatectl``, ``pactl``/``amixer``, ``systemctl``, ``/etc``), applied to setup, postconfig
and evaluator commands (an evaluator reading ``gsettings`` means the agent is to change it).
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..tasks import Task
from .evaluate import evaluator_parts, evaluator_unsupported
from .files import evaluator_getters, task_files
from .grader_names import OWN_GRADER, GraderNames
from .instruction_web import instruction_websites
from .ports import grader_port_parts, held_ports, network_problems
from .problems import BACKENDS, BackendName, evaluator_problems, task_problems
from .sources import find_source, is_internet_url

# OSWorld's SetupController step types (``_<type>_setup`` methods).
OSWORLD_STEP_TYPES = frozenset(
    {
        "download", "launch", "open", "execute", "command", "activate_window", "close_window",
        "sleep", "chrome_open_tabs", "chrome_close_tabs", "googledrive", "login",
        "update_browse_history", "upload_file", "change_wallpaper",
    }
)  # fmt: skip

# docs/osworld.md §6: tasks known to change state outside /home/user (id prefix -> what).
KNOWN_OUTSIDE_HOME: dict[str, str] = {
    "5812b315": "creates a user and /home/test1 with sudo; postconfig installs expect",
    "a462a795": "sudo su",
    "e0df059f": "root-owned directory via sudo mkdir",
    "b6781586": "system timezone",
    "94d95f96": "installs Spotify",
    "37887e8c": "/tmp/test_files",
    "28cc3b7e": "PulseAudio volume",
    "3ce045a0": "gsettings/dconf session state",
    "a4d98375": "gsettings/dconf session state",
    "bedcedc4": "gsettings/dconf session state",
    "ec4e3f68": "gsettings/dconf session state",
    "f9be0997": "gsettings/dconf session state",
    "13584542": "gsettings/dconf session state",
    "2373b66a": "sudo apt install sysstat",
    "716a6079": "sudo apt install xsel",
    "a74b607e": "sudo apt install unzip",
    "9f3bb592": "sudo pip install pysrt",
    "e1fc0df3": "installs LanguageTool",
    "f8369178": "installs the Orchis theme, gsettings",
    "48d05431": "installs conda",
    "da922383": "installs PyMuPDF",
    "3f05f3b9": "installs Picard/Kid3",
    "6766f2b8": "sudo apt install unzip/jq in setup",
    "9656a811": "sudo apt install unzip/jq in setup",
    "3299584d": "sudo apt install unzip/jq in setup",
}

# Command patterns that change state outside HOME (reason, regex over the command text).
OUTSIDE_HOME_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (reason, re.compile(pattern))
    for reason, pattern in (
        ("sudo", r"(^|[\s;&|(])sudo\b"),
        ("system packages (apt/dpkg)", r"(^|[\s;&|/])(apt|apt-get|dpkg|snap)\s"),
        ("pip install (Python environment)", r"\bpip3?\s+install\b(?!.*--user)"),
        ("/tmp", r"(^|[\s'\"=:])/tmp(/|\b)"),
        ("gsettings/dconf", r"\b(gsettings|dconf)\b"),
        ("system time (timedatectl)", r"\btimedatectl\b"),
        ("audio settings (pactl/amixer)", r"\b(pactl|amixer)\b"),
        ("systemd services", r"\bsystemctl\b"),
        ("/etc", r"(^|[\s'\"=])/etc/"),
    )
)

NEEDS_NETWORK_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "package install from the network",
        re.compile(r"\b(apt-get|apt)\s+(-\S+\s+)*install\b|\bpip3?\s+install\b|\bsnap\s+install\b"),
    ),
    ("downloads (wget/curl)", re.compile(r"\b(wget|curl)\s")),
)

URL_RE = re.compile(r"https?://[^\s'\"<>]+")
# A URL in a command counts as fetched only in a launch step or next to a network client
# (an XML namespace in a printf is not a download).
NETWORK_CLIENT_RE = re.compile(
    r"\b(wget|curl|git\s+clone|google-chrome|chromium|firefox|xdg-open|requests|urllib|httpx|aria2c)\b"
)
#: Commands whose URLs the desktop's browser opens (what a web archive of Chromium serves).
BROWSER_RE = re.compile(r"\b(google-chrome|chromium|firefox|xdg-open)\b")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0", "[::1]")

# related_apps spellings -> one app name.
APP_ALIASES = {
    "chrome": "chrome", "browser": "chrome", "google-chrome": "chrome", "chromium": "chrome",
    "os": "os", "libreoffice_calc": "libreoffice_calc", "libreoffice calc": "libreoffice_calc",
    "calc": "libreoffice_calc", "localc": "libreoffice_calc", "libreoffice_impress": "libreoffice_impress",
    "libreoffice_writer": "libreoffice_writer", "writer": "libreoffice_writer", "vscode": "vs_code",
    "vs_code": "vs_code", "code": "vs_code", "thunderbird": "thunderbird", "vlc": "vlc",
    "ubuntu_media_player": "vlc", "gimp": "gimp", "image": "gimp", "terminal": "terminal",
    "xterm": "terminal", "gnome-terminal": "terminal", "pdf": "pdf_viewer", "evince": "pdf_viewer", "nautilus": "nautilus",
    "text_editor": "text_editor", "l3afpad": "text_editor", "leafpad": "text_editor",
    "mousepad": "text_editor", "gedit": "text_editor", "libreoffice": "libreoffice",
}  # fmt: skip
HELPER_COMMANDS = frozenset(
    {"socat", "pkill", "killall", "sleep", "env", "bash", "sh", "xdg-open", "python", "python3"}
)
EXTENSION_APPS = {
    "xlsx": "libreoffice_calc", "xls": "libreoffice_calc", "ods": "libreoffice_calc", "csv": "libreoffice_calc",
    "docx": "libreoffice_writer", "doc": "libreoffice_writer", "odt": "libreoffice_writer",
    "pptx": "libreoffice_impress", "ppt": "libreoffice_impress", "odp": "libreoffice_impress",
    "pdf": "pdf_viewer", "mp4": "vlc", "mp3": "vlc", "txt": "text_editor", "json": "text_editor",
}  # fmt: skip
LIBREOFFICE_FLAGS = {
    "--calc": "libreoffice_calc",
    "--writer": "libreoffice_writer",
    "--impress": "libreoffice_impress",
}

# What the local backend's desktops provide (docs/local-desktop.md §1: xterm, l3afpad,
# LibreOffice Calc).
LOCAL_APPS = frozenset({"terminal", "text_editor", "libreoffice_calc"})


class BackendSupport(BaseModel):
    """What backends offer, for :func:`classify_task`.

    ``local_apps``: app names a local desktop has (default: terminal, text_editor,
    libreoffice_calc; ``legato tasks check`` passes what this host's desktops have:
    :func:`legato_pipelines.desktops.server.apps.installed_apps`). ``os`` in it: OSWorld's GNOME
    session (persistent gsettings, gnome-terminal, nautilus). ``local_pyautogui``: the desktops'
    ``python`` has pyautogui, so OSWorld's ``python -c "import pyautogui; ..."`` commands run
    there. ``cache_dir``: a local file cache; download/cloud_file URLs found there (or
    ``file://``) do not count as needing the internet. ``local_grader``: the names the local
    backend's grader knows (OSWorld's own when the venv is installed, else the own subset:
    ``desktops/osworld_worker/grader.py``); ``osworld_grader``: the installed desktop-env's names for
    the osworld backend (``None``: not known, names are checked when a task resets).
    ``local_network``: the local desktops' desktop option ``network`` (``auto``, the default:
    ``own`` for a batch with a task needing a network, ``desktops/network.py``; ``host``,
    ``none``, ``own``; ``None``: not known, desktops attached by URL) and ``local_desktops`` how many
    run at once (collect's runners + spares): together they decide whether a task whose
    setup or grader reaches Chrome's or VLC's port can run (:mod:`.ports`).
    ``local_route_out``: the local desktops' network reaches outside (their ``network`` and the
    reachability check of ``desktops/web.py``), so tasks opening live websites or installing
    packages run; ``local_route_why`` says why not. ``local_proxy``: an upstream proxy is set
    (desktop option ``proxy``), which OSWorld's ``proxy: true`` tasks need besides a route out.
    ``local_web_archive``: desktop option ``web=replay:ARCHIVE``'s folder: a task recorded
    there (``<task_id>.flows``) has its live websites (and proxy) served from it, with no
    route out.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    local_apps: frozenset[str] = LOCAL_APPS
    local_pyautogui: bool = False
    cache_dir: Path | None = None
    local_grader: GraderNames = OWN_GRADER
    osworld_grader: GraderNames | None = None
    local_network: Literal["auto", "host", "none", "own"] | None = "auto"
    local_desktops: int = Field(1, ge=1)
    local_route_out: bool = False
    local_route_why: str = "not checked"
    local_proxy: bool = False
    local_web_archive: Path | None = None


class TaskClass(BaseModel):
    """What one task needs (all lists are in first-seen order, without repeats)."""

    task_id: str
    domain: str | None
    setup_types: list[str] = Field(description="types of the task's setup steps")
    postconfig_types: list[str] = Field(description="types of the evaluator's postconfig steps")
    unsupported_step_types: list[str] = Field(
        description="setup/postconfig step types with no local implementation"
    )
    needs_internet: bool
    internet_urls: list[str] = Field(
        description="URLs a run would fetch (not file://, not in the cache)"
    )
    internet_reasons: list[str] = Field(
        description="other network needs: proxy, package installs, Google Drive"
    )
    apps: list[str] = Field(description="apps the task involves (related_apps, launch/open steps)")
    changes_outside_home: bool
    outside_home_reasons: list[str]
    fast_reset_eligible: bool = Field(
        description="a fast reset (kill apps, restore HOME) undoes the task"
    )
    evaluator_funcs: list[str]
    getter_types: list[str]
    evaluator_supported_locally: bool = Field(
        description="every metric/getter/rule has a local implementation and the evaluator is "
        "well-formed (a result for each metric, parallel lists of one length)"
    )
    unsupported_evaluator_parts: list[str] = Field(
        description="metrics/getters/rules with no local implementation"
    )
    local_blockers: list[str] = Field(
        description="why the local backend cannot run it (empty: it can)"
    )
    desktop_ports: list[int] = Field(
        default_factory=list,
        description="OSWorld ports its apps hold on the desktop's network (9222 Chrome, 8080 VLC)",
    )
    port_parts: list[str] = Field(
        default_factory=list,
        description="setup steps/getters reaching those ports from outside the desktop",
    )
    problems: dict[str, list[str]] = Field(
        default_factory=dict,
        description="per backend, what makes the task unrunnable there (see preflight)",
    )
    backends: list[BackendName]


class TaskTotals(BaseModel):
    """Counts over a task list (``legato tasks check`` totals)."""

    tasks: int
    by_backend: dict[str, int]
    fast_reset_eligible: int
    full_reset: int
    needs_internet: int
    evaluator_supported_locally: int
    by_domain: dict[str, int]
    top_unsupported_evaluator_parts: dict[str, int]
    top_local_blockers: dict[str, int]


def _unique(items) -> list:
    return list(dict.fromkeys(i for i in items if i))


def _is_loopback(url: Any) -> bool:
    """True for a URL on this machine (``localhost``, ``127.0.0.1``...): no internet needed."""
    parts = str(url).split("/")
    return len(parts) > 2 and any(h in parts[2] for h in LOCAL_HOSTS)


def _command_text(command: Any) -> str:
    if isinstance(command, list):
        return " ".join(str(c) for c in command)
    return str(command or "")


def _first_program(command: Any) -> str | None:
    """The program a launch/execute command starts (``VAR=x`` assignments skipped)."""
    if isinstance(command, list):
        words = [str(c) for c in command]
    else:
        try:
            words = shlex.split(str(command))
        except ValueError:
            words = str(command).split()
    words = [w for w in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
    return PurePosixPath(words[0]).name if words else None


def _apps_of_command(command: Any) -> list[str]:
    if command in (None, "", []):
        return []  # a launch step without a command: preflight names the missing parameter
    program = _first_program(command)
    if not program or program in HELPER_COMMANDS:
        return []
    if program in ("libreoffice", "soffice"):
        text = _command_text(command)
        for flag, app in LIBREOFFICE_FLAGS.items():
            if flag in text:
                return [app]
        for word in text.split():
            ext = word.rsplit(".", 1)[-1].lower() if "." in word else ""
            if ext in EXTENSION_APPS:
                return [EXTENSION_APPS[ext]]
        return ["libreoffice"]
    return [APP_ALIASES.get(program, program)]


def _steps_commands(steps: list[dict]) -> list[str]:
    out = []
    for step in steps:
        params = step.get("parameters") or {}
        if step.get("type") in ("launch", "execute", "command") and "command" in params:
            out.append(_command_text(params["command"]))
    return out


def _evaluator_commands(evaluator: dict) -> list[str]:
    return [_command_text(g["command"]) for g in evaluator_getters(evaluator) if "command" in g]


# a problem naming a setup or postconfig step's parameters (verdict.py's field paths)
_STEP_PARAMETER = re.compile(
    r"field '(?:config\.)?(?:config|evaluator\.postconfig)\[\d+\]\.parameters"
)


# System services a task's commands reach that a local desktop's sandbox does not run (it
# has a session D-Bus, no system bus or systemd): the task could be set up and graded, but
# no policy could solve it, so the local verdict refuses it (docs/local-desktop.md §13).
SYSTEM_SERVICES = {"systemd-timedated": re.compile(r"\btimedatectl\b")}
SYSTEM_SERVICES_WHY = {"systemd-timedated": "`timedatectl` asks it over the system bus"}


def classify_task(task: Task, *, backend_support: BackendSupport | None = None) -> TaskClass:
    """Classify one task (static: no desktop, no network). See :class:`TaskClass` for the fields."""
    support = backend_support or BackendSupport()
    config, evaluator = task.config, task.evaluator
    setup = task.setup
    postconfig = list(evaluator.get("postconfig") or [])
    all_steps = setup + postconfig
    setup_types = _unique(s.get("type") for s in setup)
    postconfig_types = _unique(s.get("type") for s in postconfig)
    grader = support.local_grader
    unsupported_steps = _unique(
        s.get("type") for s in all_steps if s.get("type") not in grader.step_types
    )

    commands = _steps_commands(all_steps) + _evaluator_commands(evaluator)

    # Internet: download / cloud_file files neither file:// nor in the cache (files.task_files).
    file_urls: list[str] = [
        file.url
        for file in task_files(task)
        if is_internet_url(file.url)
        and not find_source(
            file.url, dest=file.dest, cache_dir=support.cache_dir, task_id=task.task_id
        )
    ]
    urls: list[str] = []  # live websites and downloads by command (not served by any cache)
    reasons: list[str] = []
    google: list[str] = []  # Google accounts: no route out gives a local desktop one
    for step in all_steps:
        params = step.get("parameters") or {}
        if step.get("type") == "chrome_open_tabs":
            urls.extend(u for u in params.get("urls_to_open", []) if not _is_loopback(u))
        elif step.get("type") in ("googledrive", "login"):
            google.append(f"{step['type']} (Google account)")
    getters = evaluator_getters(evaluator)
    for getter in getters:
        if getter.get("type") == "googledrive_file":
            google.append("googledrive_file getter (Google account)")
    launched = {
        _command_text(s.get("parameters", {}).get("command"))
        for s in all_steps
        if s.get("type") == "launch"
    }
    fetched: list[str] = []  # by a command's own client (wget, curl...), not the browser
    for text in commands:
        if text in launched or NETWORK_CLIENT_RE.search(text):
            found = [u for u in URL_RE.findall(text) if not _is_loopback(u)]
            browser = text in launched or BROWSER_RE.search(text)
            (urls if browser else fetched).extend(found)
        reasons.extend(reason for reason, pattern in NEEDS_NETWORK_PATTERNS if pattern.search(text))
    proxy = bool(config.get("proxy"))
    # the instruction sends the agent to a website (its config may name none): instruction_web.py
    urls.extend(instruction_websites(config.get("instruction")))
    live, net_reasons, google = _unique(urls), _unique(reasons), _unique(google)
    net_reasons = _unique([*fetched, *net_reasons])  # what no browser archive serves
    reasons = _unique([*google, *reasons, *(["proxy"] if proxy else [])])
    urls = _unique(file_urls + urls + fetched)
    needs_internet = bool(urls or reasons)

    # Apps.
    apps: list[str] = []
    for name in config.get("related_apps") or []:
        key = str(name).strip().lower()
        apps.append(APP_ALIASES.get(key, key.replace(" ", "_")))
    for step in all_steps:
        params = step.get("parameters") or {}
        if step.get("type") == "launch":
            apps.extend(_apps_of_command(params.get("command")))
        elif step.get("type") == "open":
            path = str(params.get("path", ""))
            ext = path.rsplit(".", 1)[-1].lower() if "." in PurePosixPath(path).name else ""
            apps.append(
                EXTENSION_APPS.get(ext, "nautilus" if not ext else f"default app for .{ext}")
            )
        elif step.get("type") in ("chrome_open_tabs", "chrome_close_tabs", "update_browse_history"):
            apps.append("chrome")
    apps = _unique(apps)

    # State outside HOME.
    outside: list[str] = []
    for prefix, reason in KNOWN_OUTSIDE_HOME.items():
        if task.task_id.startswith(prefix):
            outside.append(f"docs/osworld.md §6: {reason}")
    for text in commands:
        outside.extend(reason for reason, pattern in OUTSIDE_HOME_PATTERNS if pattern.search(text))
    if any(s.get("type") == "googledrive" for s in all_steps) or any(
        g.get("type") == "googledrive_file" for g in getters
    ):
        outside.append("remote state (Google Drive)")
    outside = _unique(outside)

    # Evaluator.
    funcs = evaluator.get("func")
    funcs = _unique(funcs if isinstance(funcs, list) else [funcs])
    getter_types = _unique(g.get("type") for g in getters)
    unsupported_eval = _unsupported_parts(evaluator, grader)

    # Backends.
    local_blockers: list[str] = [f"step type {t}" for t in unsupported_steps]
    web = _web_problems(task.task_id, live, net_reasons, google, proxy, support)
    if file_urls:
        local_blockers.append("needs the internet")
    local_blockers += [blocker for blocker, _ in web]
    missing_apps = [a for a in apps if a not in support.local_apps and a != "os"]
    local_blockers += [f"app {a}" for a in missing_apps]
    if "os" in apps and not (set(apps) & support.local_apps):
        local_blockers.append("app os (GNOME desktop)")
    if not support.local_pyautogui and any("pyautogui" in text for text in commands):
        local_blockers.append("pyautogui commands on the desktop")
    services = [name for name, pattern in SYSTEM_SERVICES.items() if any(
        pattern.search(text) for text in commands)]  # fmt: skip
    local_blockers += [f"system service {name}" for name in services]
    local_blockers += [f"evaluator: {part}" for part in unsupported_eval]
    port_parts = grader_port_parts(task)
    network = network_problems(port_parts, support.local_network, support.local_desktops)
    if network:
        local_blockers.append(f"ports on network={support.local_network}")
    graders = {"local": grader, "osworld": support.osworld_grader, "fake": None}
    problems = {
        name: task_problems(task, name, cache_dir=support.cache_dir, grader=graders[name])
        for name in BACKENDS
    }
    # e.g. 'comand'; not a download the file cache lacks (it names a parameter's url too)
    if any(_STEP_PARAMETER.search(p) and "needs the internet" not in p for p in problems["local"]):
        local_blockers.append("setup step parameters")
    problems["local"] += [problem for _, problem in web] + _host_problems(
        missing_apps, "os" in apps and not (set(apps) & support.local_apps),
        not support.local_pyautogui and any("pyautogui" in text for text in commands),
    ) + network + [
        f"needs {name} ({SYSTEM_SERVICES_WHY[name]}), which local desktops do not run (fix: "
        "run the task on the osworld backend)" for name in services
    ]  # fmt: skip
    if support.osworld_grader is None:  # else task_problems checked against the venv's list
        problems["osworld"] += [
            f"step type {t!r} is not one of OSWorld's SetupController step types "
            f"({', '.join(sorted(OSWORLD_STEP_TYPES))}; fix: correct the type)"
            for t in setup_types + postconfig_types
            if t not in OSWORLD_STEP_TYPES
        ]
    # structure only (no result, mismatched lists): the local runtime cannot grade it either
    evaluator_broken = evaluator_problems(task, "osworld", support.cache_dir)
    backends: list[BackendName] = [name for name in BACKENDS if not problems[name]]

    return TaskClass(
        task_id=task.task_id,
        domain=task.domain,
        setup_types=setup_types,
        postconfig_types=postconfig_types,
        unsupported_step_types=unsupported_steps,
        needs_internet=needs_internet,
        internet_urls=urls,
        internet_reasons=reasons,
        apps=apps,
        changes_outside_home=bool(outside),
        outside_home_reasons=outside,
        fast_reset_eligible=not outside,
        evaluator_funcs=funcs,
        getter_types=getter_types,
        evaluator_supported_locally=not unsupported_eval and not evaluator_broken,
        unsupported_evaluator_parts=unsupported_eval,
        local_blockers=local_blockers,
        desktop_ports=held_ports(apps),
        port_parts=[name for name, _ in port_parts],
        problems=problems,
        backends=backends,
    )


def _unsupported_parts(evaluator: dict, grader: GraderNames) -> list[str]:
    """The evaluator's metrics/getters (and, for the own subset, compare_table rules) that
    ``grader`` lacks, e.g. ``["metric compare_pptx_files"]``."""
    if grader.kind == "own":
        return evaluator_unsupported(evaluator)
    if not evaluator or not evaluator.get("func") or evaluator.get("func") == "infeasible":
        return [] if evaluator and evaluator.get("func") else ["evaluator missing"]
    try:
        parts = evaluator_parts(evaluator)
    except ValueError as exc:
        return [str(exc)]
    missing = []
    for name, result, expected, _ in parts:
        if name not in grader.metrics:
            missing.append(f"metric {name}")
        for getter in (result, expected):
            if isinstance(getter, dict) and getter.get("type") not in grader.getters:
                missing.append(f"getter {getter.get('type')}")
    return _unique(missing)


def _web_problems(
    task_id: str,
    live: list[str],
    reasons: list[str],
    google: list[str],
    proxy: bool,
    support: BackendSupport,
) -> list[tuple[str, str]]:
    """``(blocker, problem)`` pairs of what a task's websites need of this host's local
    desktops (``desktops/web.py``): a Google account (never there), a route out for live
    websites and package installs, and an upstream proxy for OSWorld's ``proxy: true``; in
    replay (``local_web_archive``), a recording of the task instead of the last two for its
    websites."""
    out = []
    archive = support.local_web_archive
    if archive is not None and (live or proxy):
        if not (archive / f"{task_id}.flows").is_file():
            out.append((
                "no recorded archive",
                f"opens live websites ({', '.join(live[:3]) or 'proxy: true'}) and the web"
                f" archive {archive} holds no recording of it ({task_id}.flows) (fix: `legato"
                " web record` the task into it, or run it live: web=live)",
            ))  # fmt: skip
        live, proxy = [], False  # the archive serves them
    if google:
        out.append((
            "needs a Google account",
            f"needs a Google account ({', '.join(google[:2])}), which local desktops do not have"
            " (fix: run the task on the osworld backend with OSWorld's Google settings)",
        ))  # fmt: skip
    if (live or reasons or proxy) and not support.local_route_out:
        shown = [*live[:3], *reasons[:2], *(["proxy: true"] if proxy else [])]
        what = ", ".join(shown) + (" ..." if len(live) > 3 else "")
        out.append((
            "needs a route out",
            f"needs the internet ({what}): this host's local desktops have no route out"
            f" ({support.local_route_why}) (fix: desktop option network=own on a host that"
            " reaches the sites, or run the task on the osworld backend with a network)",
        ))  # fmt: skip
    elif proxy and not support.local_proxy:
        out.append((
            "needs a proxy",
            "OSWorld runs it through a proxy (config 'proxy': true: its sites block automated"
            " browsers) and no proxy is set (fix: desktop option proxy=http://HOST:PORT or the"
            " environment variable LEGATO_PROXY)",
        ))  # fmt: skip
    return out


def _host_problems(missing_apps: list[str], gnome: bool, pyautogui: bool) -> list[str]:
    """What this host's local desktops lack for a task (the part of the local verdict the task
    list cannot fix): apps, OSWorld's GNOME session, pyautogui."""
    out = [
        f"app {app!r} is not installed for this host's local desktops (fix: install it, "
        "docs/local-desktop.md §1, or run the task on the osworld backend)"
        for app in missing_apps
    ]
    if gnome:
        out.append(
            "app 'os' needs OSWorld's GNOME session, which local desktops lack (fix: run the "
            "task on the osworld backend)"
        )
    if pyautogui:
        out.append(
            "runs pyautogui commands, but the local desktops' python has no pyautogui (fix: "
            "scripts/osworld_venv.sh, docs/local-desktop.md §11)"
        )
    return out


def needs_full_reset(task: Task) -> bool:
    """True when the task changes state outside HOME, so only a snapshot revert / full restart
    undoes it (docs/osworld.md §6 list + command heuristics; see :func:`classify_task`)."""
    return classify_task(task).changes_outside_home


def summarize(
    classes: list[TaskClass],
    *,
    backends: tuple[str, ...] = ("local", "osworld", "fake"),
    top: int = 10,
) -> TaskTotals:
    """Totals over classified tasks; ``top`` limits the most common unsupported parts/blockers.

    ``by_backend`` counts only ``backends`` (the ones checked): a task's verdict on a backend
    is only meaningful when it was classified with that backend's support.
    """
    by_backend = {name: sum(name in c.backends for c in classes) for name in backends}
    unsupported = Counter(part for c in classes for part in c.unsupported_evaluator_parts)
    blockers = Counter(re.sub(r"^evaluator: ", "", b) for c in classes for b in c.local_blockers)
    return TaskTotals(
        tasks=len(classes),
        by_backend=by_backend,
        fast_reset_eligible=sum(c.fast_reset_eligible for c in classes),
        full_reset=sum(not c.fast_reset_eligible for c in classes),
        needs_internet=sum(c.needs_internet for c in classes),
        evaluator_supported_locally=sum(c.evaluator_supported_locally for c in classes),
        by_domain=dict(sorted(Counter(c.domain or "inline" for c in classes).items())),
        top_unsupported_evaluator_parts=dict(unsupported.most_common(top)),
        top_local_blockers=dict(blockers.most_common(top)),
    )
