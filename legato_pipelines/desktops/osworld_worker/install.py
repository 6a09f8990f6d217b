"""Create the interpreter the ``osworld`` backend's workers run under (``legato osworld install``).

``desktop-env`` 1.0.2 pins numpy<2, pandas<2.3 and torch 2.5 (docs/osworld.md §7), so it lives in
its own virtual environment, never in the project's. A plain ``pip install desktop-env`` pulls
torch with CUDA (3.6 GB download, 7.3 GB venv, docs/osworld.md §8); instead the package is
installed with ``--no-deps`` and then one of two measured recipes:

``core``   (default) what DesktopEnv, SetupController, the getters that read files and run
           commands, and the general/text/table metrics import. With the worker's lazy metric
           loader, any getter or metric whose own imports are present works.
``full``   core plus the no-torch evaluator packages (documents, images, audio, PDF): every
           metric but ``compare_image_text`` (3 tasks; needs torch and downloads OCR weights).

The VM side (pyautogui inside the VM) is not part of this venv: OSWorld's VM image has it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...user_cache import legato_cache

DESKTOP_ENV = "desktop-env==1.0.2"
#: docs/osworld.md §8 "core", plus pandas and PyPDF2 (``getters/file.py`` — vm_file,
#: cloud_file — imports pandas and ``metrics/vscode.py`` — compare_text_file — PyPDF2 at
#: module level), plus what the docker and vmware providers import (docker, psutil, filelock,
#: tqdm). Cloud providers need their SDK on top (e.g. ``<venv>/bin/pip install boto3`` for aws).
CORE = (
    "gymnasium~=0.28.1",
    "numpy==1.26.4",
    "requests",
    "requests-toolbelt",
    "python-dotenv",
    "playwright",
    "pydrive",
    "formulas",
    "lxml",
    "cssselect",
    "openpyxl",
    "tldextract",
    "xmltodict",
    "python-docx",
    "pdfplumber",
    "PyYAML",
    "rapidfuzz",
    "pytz",
    "pandas==2.2.3",
    "PyPDF2",
    "docker",
    "psutil",
    "filelock",
    "tqdm",
)
#: docs/osworld.md §8 "no-torch" on top of core.
FULL = (
    "Pillow==11.0.0",
    "opencv-python-headless==4.11.0.86",
    "python-pptx",
    "pypdf",
    "pymupdf<1.27",
    "ImageHash",
    "scikit-image",
    "librosa",
    "borb",
    "beautifulsoup4",
    "odfpy",
    "mutagen",
    "pyacoustid",
    "fastdtw",
    "chardet",
    "psutil",
    "tqdm",
)
FULL_NO_DEPS = ("easyocr==1.7.2",)  # imported lazily; its torch dependency stays out


def default_venv() -> Path:
    """``$LEGATO_OSWORLD_VENV``, else ``$XDG_CACHE_HOME/legato/osworld-venv`` (``~/.cache/...``)."""
    if os.environ.get("LEGATO_OSWORLD_VENV"):
        return Path(os.environ["LEGATO_OSWORLD_VENV"]).expanduser()
    return legato_cache("osworld-venv")


def venv_python(path: Path) -> Path:
    """The interpreter of the venv at ``path`` (``bin/python``)."""
    return Path(path) / "bin" / "python"


def is_installed(path: Path) -> bool:
    """True when ``path`` holds a venv whose python imports ``desktop_env`` and its controllers."""
    python = venv_python(path)
    if not python.exists():
        return False
    probe = "import desktop_env.controllers.python, gymnasium, pandas, requests, docker, filelock"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def install(path: Path | None = None, *, full: bool = False, quiet: bool = True) -> dict:
    """Create (or complete) the venv at ``path`` and install desktop-env plus a recipe.

    Returns ``{"venv", "python", "recipe", "seconds", "size_mb"}``. Idempotent: a venv whose
    :data:`RECIPE_FILE` holds this recipe's pip steps exactly (the full recipe's steps begin
    with the core's) and that imports desktop_env is left as it is, without running pip (a
    second run of pip re-resolved the recipes, printed its resolver's complaints and swapped
    Pillow back and forth: ~40 s); a changed pin, flag or package runs the steps again.
    Delete the file to force it. Raises ``RuntimeError`` naming the failing pip command when
    an install fails.
    """
    path = Path(path or default_venv()).expanduser().resolve()
    t0 = time.perf_counter()
    done_file = path / RECIPE_FILE
    wanted = recipe_steps(full)
    try:
        have = json.loads(done_file.read_text())["steps"]
    except (OSError, ValueError, KeyError, TypeError):
        have = None
    if have is not None and have[: len(wanted)] == wanted and is_installed(path):
        recipe = "full" if have[:4] == recipe_steps(True) else "core"
        return _installed(path, recipe, t0)
    if not venv_python(path).exists():
        venv.EnvBuilder(with_pip=True, clear=False).create(path)
    pip = [str(venv_python(path)), "-m", "pip", "install", "--disable-pip-version-check"]
    if quiet:
        pip.append("-q")
    done_file.unlink(missing_ok=True)  # until every step has run
    for step in wanted:
        argv = [*pip, *step]
        done = subprocess.run(argv)
        if done.returncode != 0:
            raise RuntimeError(
                f"osworld venv: `{' '.join(argv[2:])}` failed with {done.returncode}"
            )
    done_file.write_text(json.dumps({"steps": wanted}))
    return _installed(path, "full" if full else "core", t0)


#: In the venv: the pip steps (arguments after ``pip install``) the last ``install`` ran
#: there to the end (JSON).
RECIPE_FILE = "legato-recipe.json"


def recipe_steps(full: bool) -> list[list[str]]:
    """The pip steps of a recipe, arguments after ``pip install``: desktop-env without its
    pins, the core packages, then (``full``) the full recipe's and easyocr without torch."""
    steps = [["--no-deps", DESKTOP_ENV], list(CORE)]
    if full:
        steps += [list(FULL), ["--no-deps", *FULL_NO_DEPS]]
    return steps


def _installed(path: Path, recipe: str, t0: float) -> dict:
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return {
        "venv": str(path),
        "python": str(venv_python(path)),
        "recipe": recipe,
        "seconds": round(time.perf_counter() - t0, 1),
        "size_mb": round(size / 2**20),
    }


def osworld_python(options: dict[str, Any]) -> Path | None:
    """The OSWorld interpreter named by option ``osworld_python``, else the default venv's
    (``$LEGATO_OSWORLD_VENV`` or ``~/.cache/legato/osworld-venv``) when it exists, else
    ``None`` (no venv where the default points: the own subset under ``grader=auto``). Raises
    ``ConfigError`` when the option names a path that does not exist: a typo must not fall
    back to another grader."""
    given = options.get("osworld_python")
    if given:
        python = Path(given).expanduser()
        if not python.exists():
            raise ConfigError(
                f"desktop option osworld_python={given!r} does not exist (fix: the path of the "
                "OSWorld venv's bin/python, e.g. from `legato osworld install`)"
            )
        return python
    python = venv_python(default_venv())
    return python if python.exists() else None


if __name__ == "__main__":  # python -m legato_pipelines.desktops.osworld_worker.install [PATH]
    print(install(Path(sys.argv[1]) if len(sys.argv) > 1 else None, quiet=False))
