"""Scratch directories (legato_pipelines/scratch.py): what a process killed with SIGKILL left in the
temp folder is removed at the next start, and nothing of a live process or another program.
Real processes, real directories, a real local desktop for the sweep at start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from legato_pipelines.desktops import DesktopConfig
from legato_pipelines.scratch import OWNER_FILE, scratch_dir, sweep
from tests.desktop_local_support import needs_xvfb

MAKE_AND_WAIT = """
import sys, time
from legato_pipelines.scratch import scratch_dir
path = scratch_dir("legato-test-scratch-")
open(path + "/state", "w").write("x")
print(path, flush=True)
time.sleep(60)
"""


def killed_owner_dir(root: Path | None = None) -> Path:
    """A scratch directory under ``root`` (default: the temp folder) whose owner was killed
    with SIGKILL."""
    env = {**os.environ, "TMPDIR": str(root)} if root else dict(os.environ)
    child = subprocess.Popen(
        [sys.executable, "-c", MAKE_AND_WAIT], stdout=subprocess.PIPE, text=True, env=env
    )
    path = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert (path / "state").exists()
    return path


def owned(root: Path, name: str, pid: int, start: int, boot: str, ns: int) -> Path:
    """A ``legato-*`` directory under ``root`` with an owner file of these fields."""
    path = root / name
    path.mkdir()
    (path / OWNER_FILE).write_text(f"{pid} {start} {boot} {ns}\n")
    (path / "state").write_text("x")
    return path


def test_a_killed_owners_directory_is_swept_a_live_ones_and_foreign_ones_are_kept(
    tmp_path, monkeypatch
):
    dead = killed_owner_dir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    live = Path(scratch_dir("legato-test-scratch-"))  # this process: running
    me, start, boot, ns = (live / OWNER_FILE).read_text().split()
    foreign = tmp_path / "legato-made-by-an-older-version"
    foreign.mkdir()
    # an ended owner, but not a legato- name
    other = owned(tmp_path, "not-legato", 2**22 + 1, 1, boot, int(ns))
    # this process's pid with another start time: its owner was an earlier process, ended
    reused = owned(tmp_path, "legato-pid-reused", int(me), 1, boot, int(ns))
    # ended owners this process cannot judge: another boot, another pid namespace
    old_boot = owned(tmp_path, "legato-old-boot", 2**22 + 1, 1, "another-boot", int(ns))
    container = owned(tmp_path, "legato-other-ns", 2**22 + 1, 1, boot, int(ns) + 1)
    link = tmp_path / "legato-a-link"
    link.symlink_to(dead)
    fifo = tmp_path / "legato-fifo-owner"
    fifo.mkdir()
    os.mkfifo(fifo / OWNER_FILE)  # never waited on

    assert sorted(sweep()) == sorted([str(dead), str(reused)])
    assert not dead.exists() and not reused.exists()
    for kept in (live, foreign, other, old_boot, container, fifo):
        assert kept.is_dir(), kept
    assert link.is_symlink()
    assert sweep(str(tmp_path)) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_directory_with_a_mount_below_it_is_left(tmp_path):
    dead = killed_owner_dir(tmp_path)
    (dead / "mnt").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(dead / "mnt")], check=True)
    try:
        assert sweep(str(tmp_path)) == []
        assert dead.is_dir()
    finally:
        subprocess.run(["umount", str(dead / "mnt")], check=True)
    assert sweep(str(tmp_path)) == [str(dead)]


def test_prefix_must_be_legatos():
    with pytest.raises(ValueError, match="must start with 'legato-'"):
        scratch_dir("mine-")


@needs_xvfb
@pytest.mark.desktop
async def test_opening_local_desktops_sweeps_what_a_killed_batch_left():
    """A batch killed with SIGKILL leaves its desktops' state directories; the next batch's
    first desktops remove them, and their own directories carry an owner."""
    from legato_pipelines.desktops import open_desktops

    dead = killed_owner_dir()
    [desktop] = await open_desktops(DesktopConfig(backend="local"), 1)
    try:
        assert not dead.exists()
        state = desktop.server.state_dir
        assert (state / OWNER_FILE).read_text().split()[0] == str(os.getpid())
    finally:
        await desktop.close()
