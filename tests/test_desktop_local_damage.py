"""The ready signal from the X server's drawing reports (DAMAGE) on a real Xvfb with real apps,
beside the frame polling it replaces (``/legato/wait source=damage|poll``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from types import SimpleNamespace

import httpx
import pytest
from Xlib import X
from Xlib.display import Display

from legato_pipelines.actions import Action
from legato_pipelines.desktops.ready import ReadyPolicy, frame_delta, is_quiet, png_frame
from legato_pipelines.desktops.server.damage import Damage, DamageUnavailable
from legato_pipelines.desktops.server.xthread import XContext
from tests.desktop_local_support import (
    RunningServer,
    client_fixture,
    needs_apps,
    needs_xvfb,
    server_fixture,
)

pytestmark = [needs_xvfb, pytest.mark.desktop]

server = server_fixture(1024, 768)
client = client_fixture()

#: A shell loop that prints a line every 25 ms for 40 lines: xterm redraws for >= 1 s.
PRINT_LOOP = "for i in $(seq 40); do echo line $i; sleep 0.025; done\n"


async def settled(client) -> bool:
    """The screen now equals the screen 0.5 s later, but for a caret (the ready signal's rule;
    the benchmark's definition of a return that was not early)."""
    first = png_frame((await client.observe()).png)
    await asyncio.sleep(0.5)
    later = png_frame((await client.observe()).png)
    return is_quiet(frame_delta(first, later), ReadyPolicy())


async def xterm(client) -> None:
    await client.launch(["xterm"])
    launched = await client.wait("launch")
    assert not launched["timed_out"] and await settled(client)


@needs_apps
async def test_the_wait_holds_while_xterm_prints_and_returns_on_a_settled_screen(client):
    await xterm(client)
    for source in ("damage", "poll"):
        await client.act(Action("type", text=PRINT_LOOP))
        t0 = time.monotonic()
        waited = await client.wait("action", source=source, timeout_s=10.0)
        # the loop sleeps 40 x 25 ms after the wait started: a return before that was early
        assert waited["source"] == source and not waited["timed_out"], waited
        assert waited["changed"] and time.monotonic() - t0 >= 0.9, waited
        assert await settled(client), f"{source}: the screen still changed after the wait"


@needs_apps
async def test_the_wait_returns_on_a_static_screen_and_after_typing(client):
    await client.act(Action("left_click", x=500, y=400))  # on the bare desktop: nothing draws
    waited = await client.wait("action", source="damage")
    assert waited["source"] == "damage" and not waited["timed_out"] and not waited["changed"]
    assert waited["ready_s"] < 2.0  # well under the 5 s cap (the benchmark holds the figure)

    await client.launch(["l3afpad"])
    assert not (await client.wait("launch"))["timed_out"]
    for _ in range(3):  # a blinking caret must not hold the wait
        await client.act(Action("type", text="ready from damage\n"))
        waited = await client.wait("action", source="damage")
        assert waited["changed"] and not waited["timed_out"], waited
        assert await settled(client)


@needs_apps
async def test_a_window_that_maps_late_after_a_launch_is_waited_for(client):
    await client.launch("sleep 1; exec xterm -title late", shell=True)
    t0 = time.monotonic()
    waited = await client.wait("launch", source="damage", timeout_s=10.0)
    assert waited["changed"] and not waited["timed_out"], waited
    assert time.monotonic() - t0 >= 0.8  # the window cannot exist before the sleep ended
    assert [w["title"] for w in (await client.windows())] == ["late"]
    assert await settled(client)


@needs_apps
async def test_an_eval_wait_counts_the_quiet_since_the_action_wait_unless_something_came_between(
    client,
):
    """The grading wait after the model's turn: quiet since the last action's wait -> ready
    after one look; an action in between, or drawing in the gap, -> a whole window again
    (every wait without the credit sleeps at least 5 looks of 20 ms)."""
    await xterm(client)
    await client.act(Action("type", text="echo credited\n"))
    assert not (await client.wait("action", source="damage"))["timed_out"]
    await asyncio.sleep(0.3)  # the model's turn
    await client.observe()  # a read keeps the credit
    credited = await client.wait("eval", source="damage")
    assert not credited["timed_out"] and credited["ready_s"] < 0.1, credited
    assert await settled(client)

    await client.act(Action("left_click", x=900, y=700))  # an action: no credit
    waited = await client.wait("eval", source="damage")
    assert waited["ready_s"] >= 0.1, waited

    await client.act(Action("type", text="sleep 1; echo late\n"))
    t0 = time.monotonic()
    assert not (await client.wait("action", source="damage"))["timed_out"]
    assert time.monotonic() - t0 < 0.9  # the wait ended before the echo
    await asyncio.sleep(1.5)  # "late" is drawn in the gap
    voided = await client.wait("eval", source="damage")
    assert not voided["timed_out"] and voided["ready_s"] >= 0.1, voided


async def observe_raw(server, size=(640, 360)) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url) as raw:
        answer = await raw.get(
            "/legato/observe",
            params={"width": size[0], "height": size[1]},
            headers={"X-Legato-Token": server.token},
        )
    assert answer.status_code == 200
    return answer


@needs_apps
async def test_the_observation_prepared_during_the_wait_is_the_screen_unless_it_changed(
    client, server
):
    """The model-size observation grabbed during the wait's quiet window is answered when
    nothing changed since, and equals a fresh grab; an action or drawing after the wait
    means a fresh grab."""
    await xterm(client)
    await observe_raw(server)  # the model size to prepare from now on
    await client.act(Action("type", text="echo prepared\n"))
    assert not (await client.wait("action", source="damage"))["timed_out"]
    prepared = await observe_raw(server)
    fresh = await observe_raw(server)  # a prepared grab is used once
    assert prepared.headers["X-Observe-Prepared"] == "1"
    assert fresh.headers["X-Observe-Prepared"] == "0"
    assert prepared.content == fresh.content  # the same pixels, the same cursor

    await client.act(Action("type", text="echo moved\n"))
    assert not (await client.wait("action", source="damage"))["timed_out"]
    await client.act(Action("mouse_move", x=100, y=100))  # an action after the wait
    assert (await observe_raw(server)).headers["X-Observe-Prepared"] == "0"

    await client.act(Action("type", text="sleep 1; echo late\n"))
    assert not (await client.wait("action", source="damage"))["timed_out"]
    await asyncio.sleep(1.5)  # "late" is drawn after the wait
    late = await observe_raw(server)
    assert late.headers["X-Observe-Prepared"] == "0"
    assert late.content != prepared.content


async def test_a_bad_source_is_refused_naming_the_field(client, server):
    async with httpx.AsyncClient(base_url=server.url) as raw:
        answer = await raw.post(
            "/legato/wait",
            json={"mode": "action", "source": "fast"},
            headers={"X-Legato-Token": server.token},
        )
    assert answer.status_code == 400 and "'source'" in answer.json()["message"]


async def test_a_server_started_with_polling_polls_unless_asked():
    polling = RunningServer(640, 480, extra_args=("--ready-source", "poll"))
    client = polling.client()
    try:
        await client.act(Action("left_click", x=100, y=100))
        assert (await client.wait("action"))["source"] == "poll"
        assert (await client.wait("action", source="damage"))["source"] == "damage"
    finally:
        await client.aclose()
        polling.stop()


def test_a_server_without_damage_falls_back_to_polling():
    """An Xvfb started with DAMAGE disabled: no drawing reports, the X context polls."""
    read, write = os.pipe()
    xvfb = subprocess.Popen(
        # -noreset: the failed DAMAGE probe is the server's last client; without it Xvfb resets
        # when it disconnects and the next connection can meet the reset (connection reset)
        ["Xvfb", "-displayfd", str(write), "-extension", "DAMAGE", "-nolisten", "tcp", "-noreset"],
        pass_fds=(write,),
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    try:
        with os.fdopen(read) as numbers:  # Xvfb writes its display number once it is ready
            display = f":{numbers.readline().strip()}"
        with pytest.raises(DamageUnavailable, match="no DAMAGE extension"):
            Damage(display)
        ctx = XContext.open(SimpleNamespace(display=display, generation=1))
        try:
            assert ctx.damage is None
        finally:
            ctx.close()
    finally:
        xvfb.terminate()
        xvfb.wait(10)


@needs_apps
async def test_a_cursor_change_after_the_prepared_grab_means_a_fresh_grab(client, server):
    """The pointer's image changing after the prepared grab, while the wait still looks (the
    look takes the XFixes notice along with the drawing reports), must not leave the old
    cursor in the observation: it equals a fresh grab."""
    other = Display(server.info["display"])
    try:
        root = other.screen().root
        font = other.open_font("cursor")
        arrow, cross = (
            font.create_glyph_cursor(font, shape, shape + 1, (0, 0, 0), (65535, 65535, 65535))
            for shape in (68, 30)  # XC_left_ptr, XC_crosshair
        )
        cover = root.create_window(  # input only: it never draws
            0,
            0,
            1024,
            768,
            0,
            0,
            X.InputOnly,
            X.CopyFromParent,
            override_redirect=True,
            cursor=arrow,
        )
        cover.map()
        other.sync()
        await observe_raw(server)  # the model size to prepare
        await client.act(Action("mouse_move", x=300, y=300))  # over the cover: the arrow
        waiting = asyncio.create_task(client.wait("action", source="damage", stable_s=2.0))
        await asyncio.sleep(1.5)  # the grab came at ~1 s, the wait looks until ~2 s
        cover.change_attributes(cursor=cross)
        other.sync()
        assert not (await waiting)["timed_out"]
        first = await observe_raw(server)
        fresh = await observe_raw(server)
        assert first.content == fresh.content, first.headers["X-Observe-Prepared"]
    finally:
        other.close()
