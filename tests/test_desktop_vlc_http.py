"""VLC started the way OSWorld's vlc configs start it answers OSWorld's own VLC getter
(``get_vlc_playing_info``, run in the OSWorld venv) on a real sandboxed desktop, on the port the
server reports as DesktopEnv's ``vlc_port`` (the host's 8080, or a forwarded host port on a
desktop with a network of its own): the baseline HOME's vlcrc turns the Lua HTTP interface on
with OSWorld's password. The status it fetches is read as OSWorld's ``is_vlc_playing`` reads it
(its module needs librosa, cv2...: not in the core venv)."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import time
import wave
from xml.etree import ElementTree

import httpx
import pytest

from legato_pipelines.desktops.server.home import VLC_HTTP_PORT
from tests.desktop_local_support import RunningServer, needs_xvfb
from tests.osworld_backend_support import osworld_python

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("vlc") is None, reason="needs vlc (apt-get install vlc)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
]


@pytest.fixture(scope="module", params=["host", "own"])
def server(request):
    """A desktop on the host's network (VLC on the host's 8080) and one with a network of its
    own (VLC's 8080 forwarded from the host port its ready line reports)."""
    if request.param == "own" and shutil.which("pasta") is None:
        pytest.skip("needs pasta (apt-get install passt)")
    running = RunningServer(1024, 768, extra_args=("--network", request.param))
    yield running
    running.stop()


#: OSWorld's vlc configs launch it so (tests/data/osworld/vlc/*.json, 16 of 17 with a shell).
LAUNCH = "VLC_VERBOSE=-1 vlc --no-audio --no-video-title-show --loop /home/user/Desktop/tone.wav"
#: OSWorld's getter, as its evaluator calls it (env: what it reads of DesktopEnv); polled until
#: the status says playing (VLC takes ~1 s to start).
GETTER = """
import json, sys, time, types
from desktop_env.evaluators.getters import get_vlc_playing_info
port, cache, deadline = int(sys.argv[1]), sys.argv[2], time.monotonic() + 30
env = types.SimpleNamespace(vm_ip="127.0.0.1", vlc_port=port, cache_dir=cache)
while True:
    try:
        path = get_vlc_playing_info(env, {"dest": "status.xml"})
    except Exception as exc:  # connection refused while VLC starts
        path = repr(exc)
    if path and path.endswith("status.xml"):
        if b"<state>playing</state>" in open(path, "rb").read() or time.monotonic() > deadline:
            break
    elif time.monotonic() > deadline:
        break
    time.sleep(0.3)
print(json.dumps({"path": path}))
"""
#: Where OSWorld's ``is_vlc_playing`` looks for the playing file's name (first found wins).
FILE_PATHS = [
    f'information/category[@name="meta"]/info[@name="{name}"]'
    for name in ("filename", "title", "uri", "location", "name")
]


def tone_wav(seconds: float = 3.0, rate: int = 8000) -> bytes:
    """A mono 8-bit 440 Hz WAV (VLC plays it; no codec beyond PCM)."""
    frames = bytes(
        int(128 + 100 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(int(seconds * rate))
    )
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(rate)
        w.writeframes(frames)
    return buf.getvalue()


async def test_vlc_answers_osworld_getter(server, tmp_path):
    client = server.client()
    try:
        await client.reset()
        await client.upload("/home/user/Desktop/tone.wav", tone_wav())
        await client.launch(LAUNCH, shell=True)
        port = server.info["ports"]["vlc"]  # what DesktopEnv gets as vlc_port
        own_network = "own" in server.proc.args
        assert (port == VLC_HTTP_PORT) != own_network, (port, server.proc.args)
        t0 = time.monotonic()
        done = subprocess.run(
            [osworld_python(), "-c", GETTER, str(port), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["path"] == str(tmp_path / "status.xml"), (result, time.monotonic() - t0)
        tree = ElementTree.fromstring((tmp_path / "status.xml").read_bytes())
        assert tree.find("state").text == "playing"
        names = [e.text for e in map(tree.find, FILE_PATHS) if e is not None and e.text]
        assert names and os.path.basename(names[0]) == "tone.wav", names
        # the interface refuses a wrong password, as VLC's does in OSWorld's VM
        url = f"http://127.0.0.1:{port}/requests/status.xml"
        assert httpx.get(url, auth=("", "wrong")).status_code == 401
        assert (await client.reset())["kind"] == "fast"
        assert (await client.processes())["task"] == []
        with pytest.raises((httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)):
            httpx.get(url, auth=("", "password"))  # forwarded: pasta accepts, then closes
    finally:
        await client.aclose()
