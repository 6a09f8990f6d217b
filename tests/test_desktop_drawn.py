"""The content signals of the ready waits (issue 33 part 3): a blank window, a busy app, and
what the records and the profile say of observations handed out before an app was drawn."""

from __future__ import annotations

import subprocess
import sys
import time
from subprocess import PIPE

import numpy as np

from legato_pipelines.desktops.server import drawn
from legato_pipelines.record import ActionRecord, Record, Reset, Step
from legato_pipelines.rollout.profile import undrawn_observations


def _frame() -> np.ndarray:
    frame = np.full((720, 1280), 0xFF202020, dtype=np.uint32)  # the desktop's background
    frame[100:400, 200:700] = 0xFF000000  # a window mapped, not painted: all black
    frame[100:400, 800:1200] = 0xFF000000
    frame[300, 810:818] = 0xFF00FF00  # a prompt's few pixels in the second one
    return frame


def test_a_window_of_one_colour_is_blank_and_a_few_pixels_of_content_are_not():
    frame = _frame()
    assert drawn.blank(frame, 200, 100, 500, 300)
    assert not drawn.blank(frame, 800, 100, 400, 300)
    # the padding byte is not a colour: 0x00000000 and 0xFF000000 are the same black
    frame[150, 250] = 0x00000000
    assert drawn.blank(frame, 200, 100, 500, 300)
    # off screen parts are ignored; a sliver on screen is never judged
    frame[600:720, 0:300] = 0xFFFFFFFF  # a white window reaching past the bottom
    assert drawn.blank(frame, 0, 600, 300, 400)
    assert not drawn.blank(frame, 1275, 100, 400, 300)


def test_a_loading_process_reads_busy_and_a_sleeping_one_idle():
    code = "import time; print('up', flush=True); {}"
    spin = subprocess.Popen([sys.executable, "-c", code.format("\nwhile True: pass")], stdout=PIPE)
    sleep = subprocess.Popen([sys.executable, "-c", code.format("time.sleep(60)")], stdout=PIPE)
    try:
        assert spin.stdout.readline() == sleep.stdout.readline() == b"up\n"  # both started
        before = drawn.busy_per_pid({spin.pid, sleep.pid})
        time.sleep(0.5)
        after = drawn.busy_per_pid({spin.pid, sleep.pid})
        # a spinning process runs or waits to run the whole time, even on a loaded machine
        assert after[spin.pid] - before[spin.pid] > drawn.IDLE_SHARE * 0.5
        assert after[sleep.pid] - before[sleep.pid] < 0.05
        assert drawn.busy_per_pid({2**22 + 7}) == {}  # no such process
    finally:
        spin.kill()
        sleep.kill()
        spin.wait()
        sleep.wait()


def test_the_profile_counts_observations_of_undrawn_apps():
    def record(reset_undrawn, *action_undrawn):
        steps = [
            Step(step=i, actions=[ActionRecord(action="key", undrawn=flag)])
            for i, flag in enumerate(action_undrawn)
        ]
        reset = Reset(kind="fast", undrawn=reset_undrawn)
        return Record(rollout_id="r", attempt=0, task_id="t", reset=reset, steps=steps)

    records = [record(True, None, True), record(None, None), record(None, True, True)]
    assert undrawn_observations(records) == {"count": 4, "resets": 1, "actions": 3}
    # written only when set: a record of a drawn attempt has no such key
    assert "undrawn" not in record(None, None).model_dump(exclude_none=True)["reset"]
