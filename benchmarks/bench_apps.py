"""Reset -> ready per app on real local desktops: the ``local`` backend next to
``osworld --osworld-provider local`` (OSWorld's real DesktopEnv and SetupController in their venv
driving the same kind of local desktop server), on one real OSWorld task config per app.

    PYTHONPATH=$PWD python3 benchmarks/bench_apps.py --repeats 3
        [--backends local] [--width 1920 --height 1080] [--apps calc gimp]

(``PYTHONPATH=OTHER python3 benchmarks/bench_apps.py ...`` measures another checkout's package,
e.g. a baseline from ``git archive main | tar -x -C OTHER``: the desktop servers run it too.)

Each measurement is one ``reset(task)`` (fast reset: the previous task's processes killed,
HOME restored, then the task's setup steps: downloads from the file cache, app launches) plus
the ready wait after it, on a desktop that ran the same task just before (so the app was up).
Task files the configs download (a docx, an xlsx, a Thunderbird profile) are built here with
python-docx / openpyxl / tarfile into a file cache under OSWorld's cache names: nothing is
fetched. Prints one JSON object: per app and backend, median and p90 in seconds.

What it leaves out: the first start of each app on a desktop (a cold page cache; it is the
slowest, not repeated here), the policy's time (reset on the critical path with prepared
desktops is ``bench_local_batch.py``'s subject), and a quiet machine unless you give it one.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import tarfile
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath

from legato_pipelines.actions import Action
from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.osworld_worker.install import default_venv, venv_python
from legato_pipelines.tasks import Task, load_tasks

OSWORLD = Path(__file__).resolve().parents[1] / "tests" / "data" / "osworld"
#: app -> (OSWorld domain, task id): one task whose setup starts that app
APP_TASKS = {
    "terminal (os)": ("os", "13584542-872b-42d8-b299-866967b5c3ef"),
    "chromium": ("chrome", "2ad9387a-65d8-4e33-ad5b-7580065a27ca"),
    "gimp": ("gimp", "d52d6308-ec58-42b7-a2c9-de80e4837b2b"),
    "vlc": ("vlc", "215dfd39-f493-4bc3-a027-8a97d72c61bf"),
    "impress": ("libreoffice_impress", "2cd43775-7085-45d8-89fa-9e35c0a915cf"),
    "writer": ("libreoffice_writer", "0a0faba3-5580-44df-965d-f562a99b291c"),
    "calc": ("libreoffice_calc", "01b269ae-2111-4a07-81fd-3fcd711993b0"),
    "thunderbird": ("thunderbird", "08c73485-7c6d-4681-999d-919f5c32dcfa"),
}


def stats(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
        "n": len(ordered),
    }


def file_bytes(name: str) -> bytes:
    """A small valid file of the kind ``name`` ends with (docx, xlsx, tar.gz profile)."""
    buf = io.BytesIO()
    if name.endswith(".docx"):
        import docx

        document = docx.Document()
        document.add_paragraph("Purchasing info\tfor the\tebook and the rest of the sentence")
        document.save(buf)
    elif name.endswith(".xlsx"):
        import openpyxl

        book = openpyxl.Workbook()
        for row in range(1, 31):
            book.active.append([f"r{row}", row if row % 3 else None, row * 2])
        book.save(buf)
    elif name.endswith(".tar.gz"):
        prefs = b'user_pref("mail.shell.checkDefaultClient", false);\n'
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path, data in {
                ".thunderbird/profiles.ini": b"[Profile0]\nName=default\nIsRelative=1\n"
                b"Path=legato.default\nDefault=1\n",
                ".thunderbird/legato.default/prefs.js": prefs,
            }.items():
                info = tarfile.TarInfo(path)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    else:
        raise ValueError(f"no builder for {name}")
    return buf.getvalue()


def fill_cache(tasks, roots: list[Path]) -> None:
    """Put every ``download`` file of ``tasks`` into each cache root, under OSWorld's cache name
    (``<root>/<task_id>/<uuid5(url)>_<basename(path)>``), as DesktopEnv and the local backend
    look it up."""
    for task in tasks:
        for step in task.config.get("config", []):
            if step["type"] != "download":
                continue
            for entry in step["parameters"]["files"]:
                name = PurePosixPath(entry["path"]).name
                cached = f"{uuid.uuid5(uuid.NAMESPACE_URL, entry['url'])}_{name}"
                for root in roots:
                    (root / task.task_id).mkdir(parents=True, exist_ok=True)
                    (root / task.task_id / cached).write_bytes(file_bytes(name))


def app_tasks() -> dict[str, Task]:
    """The task of each app of :data:`APP_TASKS`, loaded from the test data: app -> Task."""
    index: dict[str, list[str]] = {}
    for domain, task_id in APP_TASKS.values():
        index.setdefault(domain, []).append(task_id)
    tasks = {t.task_id: t for t in load_tasks(index, osworld=OSWORLD)}
    return {app: tasks[task_id] for app, (_domain, task_id) in APP_TASKS.items()}


def filled_cache(tasks) -> Path:
    """A new temporary file cache (the desktops' option ``cache_dir``) holding the downloads of
    ``tasks`` (:func:`fill_cache`; also under ``desktop-0/``, the osworld backend's)."""
    cache = Path(tempfile.mkdtemp(prefix="bench-apps-cache-"))
    fill_cache(tasks, [cache, cache / "desktop-0"])
    return cache


async def used_reset(desktop, task) -> float:
    """One reset -> ready of ``task`` in seconds: ``reset(task)`` plus the ready wait, timed,
    after a key press (not timed) so that the desktop is "used" (a reset of an untouched
    desktop does nothing)."""
    await desktop.act(Action(action="key", keys=("ctrl", "l")))
    t0 = time.perf_counter()
    await desktop.reset(task)
    await desktop.wait_after_reset()
    return time.perf_counter() - t0


async def reset_to_ready(desktop, task, repeats: int) -> list[float]:
    await desktop.reset(task)  # first start of the app on this desktop: not counted
    await desktop.wait_after_reset()
    return [await used_reset(desktop, task) for _ in range(repeats)]


async def main_async(args) -> dict:
    apps = app_tasks()
    cache = filled_cache(apps.values())
    python = args.osworld_python or str(venv_python(default_venv()))
    screen = {"screen_width": args.width, "screen_height": args.height}
    configs = {
        "local": DesktopConfig(backend="local", options={"cache_dir": str(cache)}, **screen),
        "osworld-provider-local": DesktopConfig(
            backend="osworld",
            options={"osworld_python": python, "provider": "local", "cache_dir": str(cache)},
            **screen,
        ),
    }
    configs = {name: c for name, c in configs.items() if name in args.backends}
    result: dict = {"repeats": args.repeats, "screen": [args.width, args.height], "apps": {}}
    for backend, config in configs.items():
        [desktop] = await open_desktops(config, 1)
        try:
            for app, task in apps.items():
                if args.apps and app.split()[0] not in args.apps:
                    continue
                try:
                    values = await reset_to_ready(desktop, task, args.repeats)
                    cell = stats(values)
                except Exception as exc:  # noqa: BLE001 - report the app, go on with the others
                    cell = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                result["apps"].setdefault(app, {})[backend] = cell
        finally:
            await desktop.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--apps", nargs="*", help="only these apps (first word of the app name)")
    ap.add_argument("--osworld-python", default=None)
    ap.add_argument(
        "--backends", nargs="*", default=["local", "osworld-provider-local"], help="which to run"
    )
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=720)
    print(json.dumps(asyncio.run(main_async(ap.parse_args())), indent=2))


if __name__ == "__main__":
    main()
