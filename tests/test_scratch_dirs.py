"""Scratch directories (desktops/scratch.py): what a process killed with SIGKILL left in the
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
from legato_pipelines.desktops.scratch import OWNER_FILE, scratch_dir, sweep
from tests.desktop_local_support import needs_xvfb

MAKE_AND_WAIT = """
import sys, time
from legato_pipelines.desktops.scratch import scratch_dir
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


def test_a_killed_owners_directory_is_swept_a_live_ones_and_foreign_ones_are_kept(
    tmp_path, monkeypatch
):
    dead = killed_owner_dir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    live = Path(scratch_dir("legato-test-scratch-"))  # this process: running
    foreign = tmp_path / "legato-made-by-an-older-version"
    foreign.mkdir()
    other = tmp_path / "not-legato"
    other.mkdir()
    (other / OWNER_FILE).write_text(f"{2**22 + 1} 1\n")  # a dead owner, not a legato- name
    reused = tmp_path / "legato-pid-reused"
    reused.mkdir()
    # this process's pid with another start time: its owner was an earlier process, ended
    (reused / OWNER_FILE).write_text(f"{os.getpid()} 1\n")

    assert sorted(sweep()) == sorted([str(dead), str(reused)])
    assert not dead.exists() and not reused.exists()
    assert live.is_dir() and foreign.is_dir() and other.is_dir()
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
    from legato_pipelines.desktops.local.backend import open_local_desktops

    dead = killed_owner_dir()
    [desktop] = await open_local_desktops(DesktopConfig(backend="local"), 1)
    try:
        assert not dead.exists()
        state = desktop.server.state_dir
        assert (state / OWNER_FILE).read_text().split()[0] == str(os.getpid())
    finally:
        await desktop.close()
