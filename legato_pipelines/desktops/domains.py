"""Task domains' apps and the fast reset that kills them inside a VM, over OSWorld's base API.

One table of the processes each task domain starts (docs/osworld.md §6), and the shell scripts a
fast reset runs through ``/setup/execute``: kill a domain's apps, verify none survived,
restore HOME from a baseline. Shared by the ``osworld`` backend's worker (in the VM, through
DesktopEnv's server) and OSWorld VM servers attached by URL (:mod:`.vmserver`).

Standard library only: the worker runs under OSWorld's interpreter, which cannot import this
package, and loads this file by its path.
"""

from __future__ import annotations

#: Per-domain task processes a fast reset kills (docs/osworld.md §6). Names are process names
#: (``comm``, at most 15 characters: ``gnome-terminal-server`` is ``gnome-terminal-``).
DOMAIN_PROCESSES = {
    "chrome": ("chrome", "google-chrome", "chromium", "socat"),
    "gimp": ("gimp", "gimp-2.10"),
    "libreoffice_calc": ("soffice.bin", "oosplash"),
    "libreoffice_impress": ("soffice.bin", "oosplash"),
    "libreoffice_writer": ("soffice.bin", "oosplash"),
    "thunderbird": ("thunderbird",),
    "vlc": ("vlc",),
    "vs_code": ("code",),
    "os": ("gnome-terminal-", "nautilus"),
}
#: multi_apps: all of the above plus nautilus and the default .pdf/.mp4/.txt handlers.
DOMAIN_PROCESSES["multi_apps"] = tuple(
    sorted({p for names in DOMAIN_PROCESSES.values() for p in names} | {"evince", "totem", "gedit"})
)
BASELINE_DIR = "/var/tmp/legato-home-baseline"
#: Text editors the local desktop opens text files with (the local suite's ``text_editor``).
TEXT_EDITORS = ("l3afpad", "mousepad", "gedit")
#: Apps of the project's local suite (examples/tasks/local) besides OSWorld's domains
#: (docs/osworld.md §6).
LOCAL_SUITE_PROCESSES = {"terminal": ("xterm",), "text_editor": TEXT_EDITORS}
#: Domains whose tasks change state outside /home/user: a snapshot revert, never a fast reset.
REVERT_DOMAINS = frozenset({"os", "multi_apps"})


def domain_processes(domain: str | None) -> tuple[str, ...]:
    """Process names (``comm``) a fast reset kills for a task of ``domain`` (docs/osworld.md §6,
    plus the local suite's apps); ``()`` for a domain without apps of its own."""
    return tuple(DOMAIN_PROCESSES.get(domain or "") or LOCAL_SUITE_PROCESSES.get(domain or "", ()))


def fast_reset_script(
    processes: list[str] | tuple[str, ...],
    baseline: str = BASELINE_DIR,
    *,
    same_display: bool = False,
) -> str:
    """The shell script a fast reset runs in the VM through ``/setup/execute``.

    Kills the VM user's processes named ``processes`` (exact ``comm`` names), verifies none
    survived (exit 3 names the survivor; zombies do not count: OSWorld's server never reaps
    what ``/setup/launch`` started), then restores ``$HOME`` from ``baseline`` (made by
    :func:`baseline_script` on the clean VM; exit 4 when there is none: the caller reverts).
    ``same_display``: only processes whose environment has this ``$DISPLAY`` (several
    desktops share one user on a host; a VM has one display, so it is off there).
    """
    names = " ".join(sorted(set(processes)))
    scope = "1" if same_display else ""
    return f"""set -u
names="{names}"
scope="{scope}"
me="$(id -u)"
pids_of() {{  # live processes of ours named $1 (zombies have no environ: never listed)
  for p in $(pgrep -x -U "$me" -- "$1"); do
    [ "$(awk '{{print $3}}' "/proc/$p/stat" 2>/dev/null)" = Z ] && continue
    if [ -n "$scope" ]; then
      tr '\\0' '\\n' < "/proc/$p/environ" 2>/dev/null | grep -qx -- "DISPLAY=${{DISPLAY:-}}" || continue
    fi
    echo "$p"
  done
}}
for n in $names; do for p in $(pids_of "$n"); do kill -KILL "$p" 2>/dev/null; done; done
left=""
for i in 1 2 3 4 5 6 7 8 9 10; do
  left=""
  for n in $names; do [ -n "$(pids_of "$n")" ] && left="$left $n"; done
  [ -z "$left" ] && break
  sleep 0.1
done
[ -n "$left" ] && {{ echo "survived:$left"; exit 3; }}
[ -d "{baseline}" ] || {{ echo "no baseline"; exit 4; }}
find "$HOME" -mindepth 1 -maxdepth 1 -exec rm -rf -- {{}} + 2>/dev/null
cp -a "{baseline}/." "$HOME/" || exit 5
echo clean
"""


def baseline_script(baseline: str = BASELINE_DIR) -> str:
    """Shell script that snapshots the clean ``$HOME`` into ``baseline`` once (after a boot or revert)."""
    return (
        f'rm -rf "{baseline}.tmp" && mkdir -p "{baseline}.tmp" && cp -a "$HOME/." "{baseline}.tmp/" '
        f'&& rm -rf "{baseline}" && mv "{baseline}.tmp" "{baseline}" && echo baseline'
    )
