"""LibreOffice's profile, pre-built once per machine for every desktop's baseline HOME
(``desktops/server/app_profiles.py``): built by the real soffice, cached, built once when
servers start side by side, and the desktop option naming it checked."""

from __future__ import annotations

import fcntl
import random
import shutil
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from legato_pipelines.desktops.server import app_profiles
from legato_pipelines.desktops.server.desktop import prebuild_option
from legato_pipelines.desktops.server.home import LIBREOFFICE_REGISTRY, build_baseline
from legato_pipelines.errors import ConfigError

needs_soffice = pytest.mark.skipif(
    shutil.which("soffice") is None, reason="libreoffice not installed"
)
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@needs_soffice
def test_the_profile_is_built_once_and_then_taken_from_the_cache(tmp_path):
    root = tmp_path / "profiles"
    (root / ".build-left-by-a-killed-build").mkdir(parents=True)
    with ThreadPoolExecutor(3) as pool:  # three servers starting at once
        built = list(pool.map(lambda _: app_profiles.libreoffice_profile(ENV, root), range(3)))
    assert len(set(built)) == 1
    profile = built[0]
    registry = profile / LIBREOFFICE_REGISTRY
    assert b"ooSetupInstCompleted" in registry.read_bytes()
    assert (profile / ".config/libreoffice/4/user/extensions/buildid").is_file()
    assert sorted(p.name for p in profile.iterdir()) == [".config"]  # nothing but the profile
    # one build: no other profile directory, no build directory left behind
    assert sorted(p.name for p in root.iterdir()) == ["build.lock", profile.name]
    assert stat.S_IMODE(registry.stat().st_mode) == 0o644  # every desktop user reads it
    # a later start takes it as it is: soffice is not run again
    before = registry.stat().st_mtime_ns
    assert app_profiles.libreoffice_profile(ENV, root) == profile
    assert registry.stat().st_mtime_ns == before


@needs_soffice
def test_another_locale_gets_a_profile_of_its_own(tmp_path):
    c = app_profiles.libreoffice_profile(ENV, tmp_path)
    other = app_profiles.libreoffice_profile({**ENV, "LANG": "de_DE.UTF-8"}, tmp_path)
    assert other != c and other.is_dir()


def test_without_soffice_the_error_names_what_to_install(tmp_path):
    with pytest.raises(app_profiles.ProfileError, match="apt-get install libreoffice-calc"):
        app_profiles.libreoffice_profile({"PATH": str(tmp_path), "LANG": "C.UTF-8"}, tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing left


@needs_soffice
def test_the_baseline_takes_the_profile_and_merges_its_own_settings_in(tmp_path):
    profile = app_profiles.libreoffice_profile(ENV, tmp_path / "cache")
    user = tmp_path / "user-template"
    (user / ".config").mkdir(parents=True)
    (user / ".config" / "mine").write_text("kept")
    baseline = tmp_path / "baseline"
    build_baseline(baseline, uid=None, gid=None, templates=[profile, user])
    registry = (baseline / LIBREOFFICE_REGISTRY).read_text()
    assert "ooSetupInstCompleted" in registry  # soffice's own
    assert '"FirstRun"' in registry and '"ShowTipOfTheDay"' in registry  # the baseline's
    assert (baseline / ".config" / "mine").read_text() == "kept"
    assert (baseline / ".config/libreoffice/4/user/extensions/buildid").is_file()
    # the cached profile itself is never written
    assert '"FirstRun"' not in (profile / LIBREOFFICE_REGISTRY).read_text()


def test_the_prebuild_option_is_checked_naming_it():
    assert prebuild_option(None) is None  # the server's default
    assert prebuild_option([]) == ()
    assert prebuild_option(["libreoffice"]) == ("libreoffice",)
    for bad in ("libreoffice", ["gimp"], 1):
        with pytest.raises(ConfigError, match="desktop option 'prebuild'"):
            prebuild_option(bad)


def fake_soffice(bin_dir, body: str):
    """A ``soffice`` script on ``bin_dir`` running ``body`` (sh), for what the real one rarely does."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "soffice"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "LANG": "C.UTF-8"}


def test_soffice_writes_only_inside_the_build(tmp_path):
    """HOME, the XDG folders, the runtime folder and TMPDIR of the build are all inside the
    cache's build directory (the host's /run/user/1000 and /tmp are never written)."""
    env = fake_soffice(
        tmp_path / "bin",
        'mkdir -p "$HOME/.config/libreoffice/4/user"\n'
        'env > "$HOME/.config/libreoffice/4/user/registrymodifications.xcu"\n',
    )
    root = tmp_path / "profiles"
    seen = (
        app_profiles.libreoffice_profile(
            {**env, "XDG_RUNTIME_DIR": "/run/user/1000", "TMPDIR": "/tmp"}, root
        )
        / LIBREOFFICE_REGISTRY
    )
    values = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    for name in (
        "HOME",
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "XDG_DATA_HOME",
        "XDG_STATE_HOME",
        "XDG_RUNTIME_DIR",
        "TMPDIR",
    ):
        assert values[name].startswith(str(root / ".build-")), (name, values[name])
    assert "DISPLAY" not in values and "DBUS_SESSION_BUS_ADDRESS" not in values


def test_a_soffice_that_hangs_is_killed_with_what_it_started(tmp_path, monkeypatch):
    """A build past its time is killed with its whole process group, and the failure is
    remembered: the servers starting next go on without the profile at once."""
    marker = str(random.randrange(10**8, 10**9))  # a sleep no other process runs
    env = fake_soffice(tmp_path / "bin", f"sleep {marker} &\nsleep {marker}\n")
    monkeypatch.setattr(app_profiles, "BUILD_TIMEOUT_S", 0.5)
    root = tmp_path / "profiles"
    with pytest.raises(app_profiles.ProfileError, match="did not build its profile within"):
        app_profiles.libreoffice_profile(env, root)
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert left.stdout == ""
    (failed,) = root.glob("libreoffice-*.failed")
    assert sorted(p.name for p in root.iterdir()) == ["build.lock", failed.name]
    with pytest.raises(app_profiles.ProfileError, match="its build failed 0 s ago: soffice did"):
        app_profiles.libreoffice_profile(env, root)
    assert sorted(p.name for p in root.iterdir()) == ["build.lock", failed.name]  # not retried
    failed.unlink()  # as the message says: removed, the next start builds again
    with pytest.raises(app_profiles.ProfileError, match="did not build its profile within"):
        app_profiles.libreoffice_profile(env, root)


def test_a_build_held_by_another_server_is_waited_for_only_so_long(tmp_path, monkeypatch):
    env = fake_soffice(tmp_path / "bin", "exit 0\n")
    root = tmp_path / "profiles"
    root.mkdir()
    monkeypatch.setattr(app_profiles, "LOCK_WAIT_S", 0.3)
    with open(root / "build.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another server building (or stuck)
        with pytest.raises(app_profiles.ProfileError, match="another build has held .* 0 s"):
            app_profiles.libreoffice_profile(env, root)


def test_a_group_writable_cache_directory_of_this_users_is_taken_and_tightened(tmp_path):
    """A umask of 002 leaves the cache directory group-writable: it is this user's, so it is
    used and its group write bit cleared (nobody else may add entries)."""
    env = fake_soffice(
        tmp_path / "bin",
        'mkdir -p "$HOME/.config/libreoffice/4/user"\n'
        'echo built > "$HOME/.config/libreoffice/4/user/registrymodifications.xcu"\n',
    )
    root = tmp_path / "profiles"
    root.mkdir()
    root.chmod(0o775)
    assert app_profiles.libreoffice_profile(env, root).is_dir()
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").symlink_to(elsewhere)  # a cache directory that is a link: refused
    with pytest.raises(app_profiles.ProfileError, match="linked is a link: not used"):
        app_profiles.libreoffice_profile(env, tmp_path / "linked")


def test_entries_it_cannot_trust_are_refused_and_an_unfinished_one_is_rebuilt(tmp_path):
    env = fake_soffice(
        tmp_path / "bin",
        'mkdir -p "$HOME/.config/libreoffice/4/user"\n'
        'echo built > "$HOME/.config/libreoffice/4/user/registrymodifications.xcu"\n',
    )
    root = tmp_path / "profiles"
    profile = app_profiles.libreoffice_profile(env, root)
    (profile / LIBREOFFICE_REGISTRY).unlink()  # an entry without its registry: built again
    assert (app_profiles.libreoffice_profile(env, root) / LIBREOFFICE_REGISTRY).is_file()
    shutil.rmtree(profile)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "bin", elsewhere)
    profile.symlink_to(elsewhere)  # a link: never followed
    with pytest.raises(app_profiles.ProfileError, match="is a link: not used"):
        app_profiles.libreoffice_profile(env, root)
    profile.unlink()
    profile.write_text("")
    with pytest.raises(app_profiles.ProfileError, match="is not a directory"):
        app_profiles.libreoffice_profile(env, root)
    profile.unlink()
    profile.mkdir()
    profile.chmod(0o777)  # writable by anyone: not used
    with pytest.raises(app_profiles.ProfileError, match="writable by others"):
        app_profiles.libreoffice_profile(env, root)


def test_a_cache_that_cannot_be_written_names_the_fix(tmp_path):
    (tmp_path / "file").write_text("")
    env = fake_soffice(tmp_path / "bin", "exit 0\n")
    with pytest.raises(app_profiles.ProfileError, match="prebuild=\\[\\]") as failure:
        app_profiles.libreoffice_profile(env, tmp_path / "file" / "profiles")
    assert "XDG_CACHE_HOME" in str(failure.value)
