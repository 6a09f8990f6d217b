"""The way from the ``vm`` session's dock to the desktop server: a click on a favourite's icon
opens that app inside the sandbox.

The dock is a ``tint2`` panel on the host, run as the server's user outside the sandbox
(infrastructure, :mod:`.vm_look`); tint2 runs a launcher item's ``Exec`` with ``/bin/sh``. An
app started there would be tint2's child: outside the sandbox, not the desktop user's, and,
under an infrastructure process, never killed by a reset. So an item's ``Exec`` only names its
favourite: :meth:`DockChannel.exec_line` writes the favourite's desktop file name (e.g.
``vlc.desktop``) as one line into a FIFO of the state directory, ``<state>/dock``, and the
server, reading it, opens that favourite's command the way ``/setup/launch`` opens apps
(``DesktopServer.launch_favourite``: the desktop user, the task's environment and session
bus, inside the sandbox; a task process a reset kills).

Who can write the FIFO: its owner, the server's user (mode 0600; tint2 runs as that user),
and host root. Not the sandbox: the state directory is not in its mount namespace
(docs/sandbox.md §1: run directories are not there), and the FIFO has no name in the abstract
socket namespace a ``network=host`` sandbox shares with the host. Not an unsandboxed desktop's
task user (``legato-desktop``) either: not the owner. A line can only name a favourite the
dock shows now (:mod:`.dock_favourites`: the desktop user's ``favorite-apps``): the server
ignores any other (:meth:`DockChannel.take` hands the names over, the server looks them up);
the commands are the server's own. The HTTP port is not used: the dock would need the
desktop's token.

The server holds the FIFO open for reading and writing (non-blocking) from its creation, so a
writer's ``open`` never blocks while the server lives, and lines up to ``PIPE_BUF`` (4096
bytes) arrive whole.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

#: Longest line kept (bytes): a desktop file name; anything longer is dropped.
MAX_LINE = 255


class DockChannel:
    """The FIFO ``path`` (created 0600, replacing what is there), open for reading until
    :meth:`close`. Raises ``OSError`` when it cannot be made."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if self.path.is_symlink() or self.path.exists():
            self.path.unlink()
        os.mkfifo(self.path, 0o600)
        os.chmod(self.path, 0o600)  # whatever the umask
        #: the read end (O_RDWR: there is always a writer, so no end-of-file)
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._partial = b""

    def exec_line(self, name: str) -> str:
        """The ``Exec`` value of the dock's item for favourite ``name`` (a desktop file name):
        a shell command writing ``name`` as a line into the FIFO, ending in a comment. ``%``
        is doubled (a desktop entry's field code escape).

        The comment is what keeps the dock from running a desktop's text: tint2 (17.0.1,
        ``drag_and_drop.c``) runs a launcher's command with ``sh -c`` after appending each
        item dropped on it (XDND, which any X client can send, a task's included) as
        `` "item"``, escaping only backquote, dollar and backslash: a ``"`` in a dropped item ran commands as
        the panels' user on the host. Items never hold a newline (tint2 splits on it), so
        everything appended stays inside the comment and a drop is a click."""
        command = f"echo {shlex.quote(name)} > {shlex.quote(str(self.path))} #"
        return command.replace("%", "%%")

    def take(self) -> list[str]:
        """The names written since the last call (complete lines only; empty or over-long
        lines and undecodable bytes dropped). Never blocks."""
        if self.fd is None:
            return []
        data = self._partial
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > MAX_LINE:
            self._partial = b""
        names = []
        for line in lines:
            name = line.decode(errors="replace").strip()
            if name and len(line) <= MAX_LINE and "\ufffd" not in name:
                names.append(name)
        return names

    def close(self) -> None:
        """Close the read end and remove the FIFO."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.path.unlink(missing_ok=True)
