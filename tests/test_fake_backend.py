"""The fake backend on its own: real PNG screens, seeded rewards, clear config errors."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from legato_pipelines import ConfigError, DesktopConfig, DesktopError, load_tasks
from legato_pipelines.actions import Action
from legato_pipelines.desktops.backends.fake import FakeDesktop


def task(success=0.5):
    return load_tasks(
        [{"task_id": "t", "config": {"instruction": "x", "fake": {"success": success}}}]
    ).tasks[0]


async def test_screens_are_real_pngs_that_change_with_the_step():
    desktop = FakeDesktop(DesktopConfig(backend="fake"), 0)
    await desktop.reset(task(), seed=1)
    first = await desktop.observe()
    await desktop.act(Action("left_click", {}, x=1, y=1))
    second = await desktop.observe()
    assert first.sha != second.sha
    img = Image.open(io.BytesIO(second.png))
    assert img.size == (1280, 720) == second.size


async def test_unique_frames_are_distinct_valid_pngs():
    desktop = FakeDesktop(DesktopConfig(backend="fake", options={"unique": True, "frames": 2}), 3)
    await desktop.reset(task(), seed=1)
    shots = [await desktop.observe() for _ in range(5)]
    assert len({s.sha for s in shots}) == 5
    for s in shots:
        img = Image.open(io.BytesIO(s.png))
        img.load()
        assert img.text["legato"].startswith("fake-3:")


async def test_reward_follows_the_attempt_seed_and_probability():
    desktop = FakeDesktop(DesktopConfig(backend="fake"), 0)
    rewards = []
    for seed in range(200):
        await desktop.reset(task(0.3), seed=seed)
        rewards.append((await desktop.evaluate(task(0.3))).reward)
    assert 0.2 < sum(rewards) / len(rewards) < 0.4
    again = FakeDesktop(DesktopConfig(backend="fake"), 7)
    await again.reset(task(0.3), seed=5)
    assert (await again.evaluate(task(0.3))).reward == rewards[5]
    await desktop.reset(task(1.0), seed=9)
    assert (await desktop.evaluate(task(1.0))).reward == 1.0


async def test_crash_needs_recover():
    desktop = FakeDesktop(DesktopConfig(backend="fake", options={"faults": {"crash": 1.0}}), 0)
    await desktop.reset(task(), seed=0)
    with pytest.raises(DesktopError) as info:
        await desktop.act(Action("left_click", {}, x=1, y=1))
    assert info.value.kind == "crash"
    with pytest.raises(DesktopError):
        await desktop.observe()
    await desktop.recover()
    await desktop.observe()


@pytest.mark.parametrize(
    "options,field",
    [
        ({"latency": {"act": {"dist": "gamma"}}}, "latency.act"),
        ({"latency": {"click": 1}}, "latency"),
        ({"faults": {"crash": 2}}, "faults.crash"),
        ({"colour": 1}, "not fake-backend options"),
    ],
)
def test_bad_options_name_the_field(options, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        FakeDesktop(DesktopConfig(backend="fake", options=options), 0)


def _pixels(shot):
    with Image.open(io.BytesIO(shot.png)) as img:
        return img.mode, img.size, img.tobytes()


@pytest.mark.parametrize("screen", [(1280, 720), (1920, 1080)])
@pytest.mark.parametrize("variant", ["qwen3vl", "qwen25vl"])
async def test_model_size_observation_is_what_the_collector_would_send(screen, variant):
    """observe(size=) hands out the model-size screen the collector-side path makes of the
    full screen (decode, Pillow's default resize, encode): same size, same bytes; a unique
    observation has the same pixels and its own tEXt chunk."""
    from legato_pipelines.harness import Harness
    from legato_pipelines.harness.resize import resize_screenshot

    harness = Harness(variant=variant)
    size = harness.episode("x", screen).model_size
    config = DesktopConfig(backend="fake", screen_width=screen[0], screen_height=screen[1])
    desktop = FakeDesktop(config, 2)
    unique = FakeDesktop(config.model_copy(update={"options": {"unique": True}}), 2)
    for d in (desktop, unique):
        await d.reset(task(), seed=1)
    for _ in range(3):
        full, shot, tagged = await desktop.observe(), await desktop.observe(size), None
        tagged = await unique.observe(size)
        assert full.size == screen and shot.size == tagged.size == size != screen
        expected = resize_screenshot(full, harness.resize_rule)
        assert shot.png == expected.png  # the same bytes the collector would have made
        assert _pixels(tagged) == _pixels(expected) and tagged.png != expected.png
        assert tagged.complete() and shot.complete()
        for d in (desktop, unique):
            await d.act(Action("left_click", {}, x=1, y=1))


async def test_truncated_model_size_screenshot_is_incomplete():
    desktop = FakeDesktop(
        DesktopConfig(backend="fake", options={"faults": {"truncated_screenshot": 1.0}}), 0
    )
    await desktop.reset(task(), seed=0)
    shot = await desktop.observe((1280, 704))
    assert shot.size == (1280, 704) and not shot.complete()
