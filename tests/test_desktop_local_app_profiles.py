"""LibreOffice's profile, pre-built once per machine for every desktop's baseline HOME
(``desktops/local/app_profiles.py``): built by the real soffice, cached, built once when
servers start side by side, and the desktop option naming it checked."""

from __future__ import annotations

import shutil
import stat
from concurrent.futures import ThreadPoolExecutor

import pytest

from legato_pipelines.desktops.local import app_profiles
from legato_pipelines.desktops.local.backend import _prebuild
from legato_pipelines.desktops.local.home import LIBREOFFICE_REGISTRY, build_baseline
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
    assert _prebuild(None) is None  # the server's default
    assert _prebuild([]) == ()
    assert _prebuild(["libreoffice"]) == ("libreoffice",)
    for bad in ("libreoffice", ["gimp"], 1):
        with pytest.raises(ConfigError, match="desktop option 'prebuild'"):
            _prebuild(bad)
