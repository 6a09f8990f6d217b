"""The ready signal's frame comparison and waiting loop, on synthetic frames with a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from legato_pipelines.desktops.ready import (
    Activity,
    Delta,
    ReadyPolicy,
    ReadyResult,
    frame_delta,
    is_quiet,
    policy_for,
    wait_until_ready,
)

H, W = 120, 160


def blank() -> np.ndarray:
    return np.zeros((H, W), dtype=np.uint32)


def with_box(x: int, y: int, w: int, h: int, value: int = 0xFFFFFF) -> np.ndarray:
    frame = blank()
    frame[y : y + h, x : x + w] = value
    return frame


def test_frame_delta_counts_pixels_and_boxes_small_changes():
    assert frame_delta(blank(), blank()) == Delta(0)
    assert frame_delta(blank(), with_box(10, 20, 1, 19)) == Delta(19, (10, 20, 11, 39))
    big = frame_delta(blank(), with_box(0, 0, 50, 50))
    assert big.changed == 2500 and big.bbox is None


def test_caret_blink_is_quiet_but_a_glyph_is_not():
    policy = ReadyPolicy()
    assert is_quiet(frame_delta(blank(), with_box(10, 20, 1, 19)), policy)  # l3afpad caret: 1x19
    assert is_quiet(frame_delta(blank(), with_box(10, 20, 2, 30)), policy)
    assert not is_quiet(
        frame_delta(blank(), with_box(10, 20, 6, 10)), policy
    )  # a typed glyph is wider
    assert not is_quiet(frame_delta(blank(), with_box(10, 0, 1, 60)), policy)  # too tall
    assert not is_quiet(frame_delta(blank(), with_box(0, 0, 40, 40)), policy)  # too many pixels


def test_policy_for_modes():
    assert policy_for("action").stable_pairs == 3
    assert policy_for("launch", heavy=True).stable_s >= 0.5
    assert (
        policy_for("action", heavy=True).stable_s == 0.15
    )  # heavy apps lengthen launch/reset only
    assert policy_for("reset", launch_pending=True).require_change
    assert not policy_for("action", launch_pending=True).require_change
    assert policy_for("eval", timeout_s=2.0, stable_s=None).timeout_s == 2.0
    with pytest.raises(ValueError, match="unknown wait mode"):
        policy_for("later")


class Screen:
    """Frames on a fake clock: ``changes`` maps a time (s) to the frame shown from then on."""

    def __init__(self, changes: dict[float, np.ndarray]):
        self.now = 0.0
        self.changes = sorted(changes.items())
        self.grabs = 0
        self.drawn: np.ndarray | None = None  # the frame at the last activity() look
        self.redraw_until = 0.0  # same-pixel redraws are reported until then (s)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def grab(self) -> np.ndarray:
        self.grabs += 1
        shown = self.changes[0][1]
        for at, frame in self.changes:
            if at <= self.now + 1e-9:
                shown = frame
        return shown

    async def wait_damage(self, policy: ReadyPolicy, **kwargs) -> ReadyResult:
        """:func:`wait_until_ready` on the damage path (:meth:`activity`), on this clock."""
        return await wait_until_ready(
            self.grab, policy, activity=self.activity, clock=self.clock, sleep=self.sleep, **kwargs
        )

    async def activity(self) -> Activity:
        """Damage reports: the box of what changed since the previous look (exact, like DAMAGE),
        or a same-pixel redraw while ``now < redraw_until``."""
        self.grabs -= 1  # peeking is not a grab
        shown = await self.grab()
        seen = Delta(0) if self.drawn is None else frame_delta(self.drawn, shown)
        self.drawn = shown
        if seen.changed == 0 and self.now < self.redraw_until:
            seen = Delta(100, (0, 0, 10, 10))
        return Activity(seen)


async def test_ready_after_three_quiet_pairs_on_a_static_screen():
    screen = Screen({0.0: blank()})
    result = await wait_until_ready(
        screen.grab, ReadyPolicy(), clock=screen.clock, sleep=screen.sleep
    )
    assert result.ready_s == pytest.approx(0.15) and result.frames == 4
    assert not result.changed and not result.timed_out


async def test_a_change_restarts_the_stable_window():
    screen = Screen({0.0: blank(), 0.1: with_box(0, 0, 30, 30), 0.2: with_box(0, 0, 60, 60)})
    result = await wait_until_ready(
        screen.grab, ReadyPolicy(), clock=screen.clock, sleep=screen.sleep
    )
    assert result.changed and result.ready_s == pytest.approx(0.35)


async def test_blinking_caret_does_not_delay_ready():
    caret_on = with_box(10, 20, 1, 19)
    screen = Screen({0.0: blank(), 0.05: caret_on, 0.1: blank(), 0.15: caret_on})
    result = await wait_until_ready(
        screen.grab, ReadyPolicy(), clock=screen.clock, sleep=screen.sleep
    )
    assert result.ready_s == pytest.approx(0.15)


async def test_require_change_waits_for_the_launched_window():
    before = blank()
    screen = Screen({0.0: before, 0.5: with_box(20, 20, 80, 60)})
    policy = ReadyPolicy(require_change=True, stable_s=0.2)
    result = await wait_until_ready(
        screen.grab, policy, reference=before, clock=screen.clock, sleep=screen.sleep
    )
    assert result.changed and result.ready_s == pytest.approx(0.7)
    # Without the requirement the unchanged screen is "ready" before the window exists.
    screen = Screen({0.0: before, 0.5: with_box(20, 20, 80, 60)})
    early = await wait_until_ready(
        screen.grab, ReadyPolicy(stable_s=0.2), clock=screen.clock, sleep=screen.sleep
    )
    assert early.ready_s == pytest.approx(0.2) and not early.changed


async def test_a_new_window_arms_the_wait_even_without_a_visible_change():
    screen = Screen({0.0: blank()})
    calls = []

    async def new_window() -> bool:
        calls.append(screen.now)
        return screen.now >= 0.3

    policy = ReadyPolicy(require_change=True)
    result = await wait_until_ready(
        screen.grab,
        policy,
        reference=blank(),
        new_window=new_window,
        clock=screen.clock,
        sleep=screen.sleep,
    )
    assert result.ready_s == pytest.approx(0.45) and not result.timed_out


async def test_wait_is_capped_and_reports_the_cap():
    frames = {
        t / 100: with_box(0, 0, 10 + (t % 50), 10) for t in range(0, 200, 5)
    }  # always changing
    screen = Screen(frames)
    result = await wait_until_ready(
        screen.grab, ReadyPolicy(timeout_s=1.0), clock=screen.clock, sleep=screen.sleep
    )
    assert result.timed_out and result.ready_s == pytest.approx(1.0)


async def test_damage_ready_after_the_quiet_window_once_something_drew():
    screen = Screen({0.0: blank(), 0.1: with_box(0, 0, 30, 30), 0.14: with_box(0, 0, 60, 60)})
    await screen.activity()  # cleared at the action
    policy = ReadyPolicy()
    result = await screen.wait_damage(policy)
    # the last drawing is seen at the 0.14 s look, then 3 quiet looks of 20 ms (quiet_s 0.06)
    assert result.source == "damage" and result.changed
    assert result.ready_s == pytest.approx(0.2)
    assert result.frames == 3  # the first frame and one per look that saw drawing


async def test_damage_with_nothing_drawn_waits_the_whole_stable_window():
    screen = Screen({0.0: blank()})
    await screen.activity()
    result = await screen.wait_damage(ReadyPolicy())
    assert result.ready_s == pytest.approx(0.16) and not result.changed  # 8 looks >= 0.15 s


async def test_damage_redraws_of_the_same_pixels_hold_the_wait_but_are_no_change():
    screen = Screen({0.0: blank()})
    await screen.activity()
    screen.redraw_until = 0.49  # the last redraw is seen at the 0.48 s look
    result = await screen.wait_damage(ReadyPolicy())
    assert result.ready_s == pytest.approx(0.54) and not result.changed


async def test_damage_credit_of_a_quiet_gap_makes_a_quiet_screen_ready_at_once():
    """``quiet_before_s``: the gap since the previous wait was quiet (the first look reports
    nothing drawn in it), so the window is already served: one look, no sleep."""
    screen = Screen({0.0: blank()})
    await screen.activity()  # the previous wait's last look
    policy = ReadyPolicy(stable_s=0.25, quiet_s=0.1)  # the eval mode's window
    result = await screen.wait_damage(policy, quiet_before_s=0.3)
    assert result.ready_s == 0.0 and not result.timed_out and not result.changed
    assert result.quiet_s == pytest.approx(0.3)


async def test_damage_credit_counts_toward_the_window_and_drawing_in_the_gap_voids_it():
    policy = ReadyPolicy(stable_s=0.25, quiet_s=0.1)
    short = Screen({0.0: blank()})
    await short.activity()
    # 10 of the 13 looks the 0.25 s window needs
    result = await short.wait_damage(policy, quiet_before_s=0.2)
    assert result.ready_s == pytest.approx(0.06)  # the 3 looks left

    drawn = Screen({0.0: blank()})
    await drawn.activity()
    drawn.changes = [(0.0, with_box(0, 0, 50, 50))]  # drawn in the gap, before the wait
    result = await drawn.wait_damage(policy, quiet_before_s=5.0)
    # the credit is void: the drawing restarts the count, 5 quiet looks (0.1 s) once it drew
    # (not ``changed``: the wait's first frame already showed it)
    assert result.ready_s == pytest.approx(0.1) and result.quiet_s == pytest.approx(0.1)
