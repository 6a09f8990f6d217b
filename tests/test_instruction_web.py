"""The verdict reads the instruction for web resources (issue 33, part 5), on OSWorld's own
configs (tests/data/osworld): a task whose instruction sends the agent to a website needs the
internet even when its config names no URL, so the local backend refuses it."""

from __future__ import annotations

import orjson
import pytest

from legato_pipelines.desktops.support import backend_support
from legato_pipelines.osworld_format import classify_task
from legato_pipelines.osworld_format.instruction_web import instruction_websites
from legato_pipelines.osworld_format.verdict import preflight
from legato_pipelines.tasks import Task, load_tasks
from tests.osworld_data import OSWORLD

#: every test_all instruction naming a web address, and the first one it names
NAMED = {
    "3299584d": "funbrain.com",
    "26660ad1": "speedtest.net",
    "3c8f201a": "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/"
    "multi_apps/3c8f201a-009d-4bbe-8b65-a6f8b35bb57f/kingbird.jpeg",
    "69acbb55": "https://github.com/xlang-ai/instructor-embedding",
    "788b3701": "https://github.com/liangjs333/4th-year-in-tsinghua-eng",
    "aad10cd7": "https://developer.apple.com/design/human-interface-guidelines/searching",
    "acb0f96b": "https://github.com/xlang-ai/instructor-embedding",
    "da52d699": "https://howlongtoread.com/",
    "e2392362": "academicpages.github.io",
    "f8369178": "gnome-look.org",
    "bba3381f": "https://devstreaming-cdn.apple.com/videos/streaming/examples/"
    "img_bipbop_adv_example_fmp4/master.m3u8",
}


def _task(domain: str, prefix: str) -> Task:
    (path,) = (OSWORLD / domain).glob(f"{prefix}*.json")
    config = orjson.loads(path.read_bytes())
    return Task(task_id=config["id"], domain=domain, config=config, source=f"osworld:{path}")


@pytest.fixture(scope="module")
def test_all():
    return load_tasks(OSWORLD / "test_all.json")


def test_the_rule_finds_exactly_the_instructions_that_name_a_site(test_all):
    found = {
        t.task_id[:8]: instruction_websites(t.instruction)
        for t in test_all
        if instruction_websites(t.instruction)
    }
    assert {k: v[0] for k, v in found.items()} == NAMED
    # a URL at the end of a sentence loses the full stop, not its path
    assert found["788b3701"] == ["https://github.com/liangjs333/4th-year-in-tsinghua-eng"]
    assert found["69acbb55"][1].startswith("https://colab.research.google.com/drive/")


@pytest.mark.parametrize(
    "domain, prefix",
    [
        ("thunderbird", "15c3b339"),  # anonym-x2024@outlook.com: an account, not a site
        ("thunderbird", "9b7bc335"),  # two e-mail addresses and "the online account"
        ("chrome", "9656a811"),  # "potentially harmful or unsafe website": a setting
        ("chrome", "030eeff7"),  # "my online privacy"
        ("chrome", "bb5e4c0d"),  # "when I look stuff up on the internet"
    ],
)
def test_words_and_e_mail_addresses_are_no_website(domain, prefix):
    assert instruction_websites(_task(domain, prefix).instruction) == []


def test_loopback_and_paths_are_no_website():
    text = (
        "Open http://localhost:8080/index.html and http://[::1]:5000/, then save "
        "/home/user/notes.com.txt and mail bob@example.org; see www.example.org."
    )
    assert instruction_websites(text) == ["www.example.org"]


@pytest.fixture(scope="module")
def cache_and_apps(tmp_path_factory):
    """The local backend's support on this host (its apps, OSWorld's grader), with a file
    cache holding every file the checked tasks' configs reference (empty placeholders)."""
    from legato_pipelines.osworld_format.files import task_files
    from legato_pipelines.osworld_format.sources import cache_names, is_internet_url

    cache = tmp_path_factory.mktemp("osworld-files")
    for domain, prefix in (("vlc", "bba3381f"), ("multi_apps", "acb0f96b")):
        task = _task(domain, prefix)
        for file in task_files(task):
            if is_internet_url(file.url):
                path = cache / task.task_id / cache_names(file.url, file.dest)[0]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
    return backend_support("local", {"cache_dir": str(cache)})


@pytest.mark.parametrize(
    "domain, prefix, site",
    [
        # its config names no URL at all: VLC is to stream the instruction's link
        ("vlc", "bba3381f", NAMED["bba3381f"]),
        # its config's only URL is a cached file: the repo to clone is the instruction's
        ("multi_apps", "acb0f96b", NAMED["acb0f96b"]),
    ],
)
def test_a_task_sent_to_a_website_is_not_runnable_offline(domain, prefix, site, cache_and_apps):
    task = _task(domain, prefix)
    assert site not in orjson.dumps(task.config["config"]).decode()
    verdict = classify_task(task, backend_support=cache_and_apps)
    assert verdict.needs_internet
    assert site in verdict.internet_urls
    assert "local" not in verdict.backends
    assert "osworld" in verdict.backends  # a VM with a network runs it
    problems = preflight([task], "local", support=cache_and_apps)
    assert any("needs the internet" in p and site in p for p in problems), problems
