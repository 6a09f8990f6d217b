"""Enter a desktop's sandbox, or start its init, with privileges dropped by host code alone.

Run by the desktop server as a script of the *host's* Python (``python -I -S enter.py``,
:func:`enter_argv`, :func:`init_argv`), never imported inside a sandbox. Every privilege is
dropped here, in this one process, before anything of the sandbox's filesystem is executed or
loaded: no ``PATH`` lookup, no ``ld.so.preload``/``LD_*`` of the sandbox's root while this
process is privileged (issue 30, item 2; docs/sandbox.md §2).

Why not util-linux alone (measured on kernel 6.x, util-linux 2.38):

- ``setns(CLONE_NEWUSER)`` gives the joining process a *full* bounding set in the new user
  namespace (the kernel's ``set_cred_user_ns``), so ``setpriv --bounding-set`` run *before*
  ``nsenter --user`` is undone; it has to run after the user namespace is joined;
- after ``setns(CLONE_NEWNS)`` the root and working directory are the sandbox's (the kernel
  sets both to the namespace's root), so any binary ``nsenter`` execs next (``setpriv``)
  comes from the sandbox's root, with its loader and ``/etc/ld.so.preload``, still uid 0
  with every capability of the sandbox's user namespace;
- a chain of host tools that keeps the host's root (``nsenter --root=/``, then host
  ``setpriv``, then a second ``nsenter --root``) would, between the two, run a process
  holding exactly root-inside's capabilities with the host's ``/`` as its root: root inside
  could open ``/proc/PID/root`` of it (same uid, capabilities a subset of its own).

So this script does, in order, with everything it needs loaded first: open the namespace
files, ``setns`` ipc, [net], pid, mnt (as host root: the ipc namespace may be owned by the
host's user namespace), then user; drop :data:`.sandbox.CAPS_DROPPED` from the
bounding set; fork (the pid namespace is the child's); in the child ``setgroups([])``,
``setresgid``, ``setresuid`` (which clears every capability), ``chdir`` and only then
``execvpe`` the command, found on the task's ``PATH`` as the unprivileged user. The parent
waits and exits as the child did (as ``nsenter`` does). ``sys.path`` is emptied before the
first ``setns``: an import afterwards would read the sandbox's ``/usr``.

``init`` mode (the end of the sandbox's setup, still on the host's root): ``pivot_root``,
detach the old root, drop the bounding set, then exec ``tini`` from the new root with an
empty environment.

Exit codes: the command's own; 125 when entering failed (message on stderr), 126/127 when
the command cannot be run / is not found (as ``env``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys

#: Capability numbers (linux/capability.h) of the names in :data:`.sandbox.CAPS_DROPPED`.
CAP_NUMBERS = {
    "chown": 0,
    "dac_override": 1,
    "net_admin": 12,
    "net_raw": 13,
    "sys_module": 16,
    "sys_rawio": 17,
    "sys_chroot": 18,
    "sys_ptrace": 19,
    "sys_admin": 21,
    "sys_boot": 22,
    "sys_nice": 23,
    "sys_resource": 24,
    "sys_time": 25,
    "mknod": 27,
    "audit_control": 30,
    "setfcap": 31,
    "mac_override": 32,
    "mac_admin": 33,
    "syslog": 34,
}
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
PR_CAPBSET_DROP = 24
MNT_DETACH = 2
#: ``pivot_root``'s syscall number per machine (glibc has no wrapper).
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "i686": 217, "ppc64le": 203}
_libc = ctypes.CDLL(None, use_errno=True)


def enter_argv(
    python: str, init_pid: int, caps: tuple[str, ...], net: bool, uid: int, gid: int, cwd: str
) -> list[str]:
    """The argv prefix that runs a command inside the sandbox whose init is host pid
    ``init_pid`` (joining its network namespace too when ``net``), as ``uid``/``gid`` in
    ``cwd``, with ``caps`` (names as ``setpriv``'s) gone from the bounding set. ``python``:
    the host's interpreter (an absolute path). The command's argv follows the prefix."""
    drop = ",".join(str(CAP_NUMBERS[cap]) for cap in caps)
    return [python, "-I", "-S", __file__, "enter", str(init_pid), drop, "1" if net else "0"] + [
        str(uid),
        str(gid),
        cwd,
        "--",
    ]


def init_argv(python: str, caps: tuple[str, ...]) -> list[str]:
    """The argv that ends a sandbox's setup (run in the directory that becomes its root):
    ``pivot_root``, old root detached, ``caps`` dropped from the bounding set, ``tini`` as
    the init (``tini -s -p SIGKILL -- /bin/sleep infinity``, empty environment)."""
    drop = ",".join(str(CAP_NUMBERS[cap]) for cap in caps)
    return [python, "-I", "-S", __file__, "init", drop]


def _default_signals() -> None:
    """Back to the default action for every ignored signal: those Python ignores at start
    (SIGPIPE, SIGXFSZ) and those the collector inherited ignored (``nohup legato collect &``:
    SIGHUP, SIGINT, SIGQUIT). An ignored signal stays ignored across exec: ``yes | head``
    would print "Broken pipe" instead of ending, and Ctrl+C in the desktop's terminal would
    stop nothing, unlike on OSWorld's VM."""
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if signal.getsignal(signum) is signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):  # realtime signals the C library keeps for itself
            continue


def _fail(message: str, code: int = 125) -> None:
    os.write(2, f"legato enter: {message}\n".encode(errors="replace"))
    os._exit(code)


def _check(result: int, what: str) -> None:
    if result != 0:
        _fail(f"{what}: {os.strerror(ctypes.get_errno())}")


def _drop_bounding_set(drop: str) -> None:
    for cap in drop.split(",") if drop else ():
        _check(_libc.prctl(PR_CAPBSET_DROP, int(cap), 0, 0, 0), f"dropping capability {cap}")


def _enter(args: list[str]) -> None:
    init_pid, drop, net, uid, gid, cwd, sep, *command = args
    if sep != "--" or not command:
        _fail("usage: enter PID CAPS NET UID GID CWD -- COMMAND...")
    # as nsenter: every other namespace first, as host root (the ipc namespace may be the X
    # server's, owned by the host's user namespace), the user namespace last
    kinds = [("ipc", CLONE_NEWIPC)]
    if net == "1":
        kinds.append(("net", CLONE_NEWNET))
    kinds += [("pid", CLONE_NEWPID), ("mnt", CLONE_NEWNS), ("user", CLONE_NEWUSER)]
    try:
        fds = [(os.open(f"/proc/{init_pid}/ns/{name}", os.O_RDONLY), kind) for name, kind in kinds]
    except OSError as exc:
        _fail(f"the sandbox (init {init_pid}) is gone: {exc.strerror}")
    sys.path[:] = []  # from here on, an import would read the sandbox's files: none happens
    for fd, kind in fds:
        _check(_libc.setns(fd, kind), f"setns {kind:#x}")
        os.close(fd)
    _drop_bounding_set(drop)
    try:
        child = os.fork()
    except OSError as exc:
        _fail(f"fork: {exc.strerror}")
    if child:
        _wait(child)
    try:
        os.setgroups([])
        os.setresgid(int(gid), int(gid), int(gid))
        os.setresuid(int(uid), int(uid), int(uid))
    except OSError as exc:
        _fail(f"cannot become {uid}:{gid}: {exc.strerror}")
    try:
        os.chdir(cwd)
    except OSError as exc:
        _fail(f"cannot change directory to {cwd!r}: {exc.strerror}")
    _default_signals()
    _execvpe(command, dict(os.environ))


def _execvpe(command: list[str], env: dict[str, str]) -> None:
    """``execvpe`` as glibc's: ``command[0]`` looked up on ``env``'s ``PATH`` (by the
    unprivileged user: :func:`os.execvpe` would import ``warnings`` from the sandbox), a file
    without a known header run by ``/bin/sh`` (``ENOEXEC``)."""
    name = command[0]
    dirs = [""] if "/" in name else env.get("PATH", "/usr/bin:/bin").split(":")
    error = errno.ENOENT
    for directory in dirs:
        path = f"{directory or '.'}/{name}" if directory or "/" not in name else name
        try:
            os.execve(path, command, env)
        except OSError as exc:
            if exc.errno == errno.ENOEXEC:
                try:
                    os.execve("/bin/sh", ["/bin/sh", path, *command[1:]], env)
                except OSError as sh_exc:
                    exc = sh_exc
            if exc.errno != errno.ENOENT or error == errno.ENOENT:
                error = exc.errno if exc.errno is not None else error
    _fail(f"{name!r}: {os.strerror(error)}", 127 if error == errno.ENOENT else 126)


def _wait(child: int) -> None:
    """Wait for ``child`` and exit as it did (a stopped child stops us too, as nsenter)."""
    while True:
        try:
            _, status = os.waitpid(child, os.WUNTRACED)
        except InterruptedError:
            continue
        if os.WIFSTOPPED(status):
            os.kill(os.getpid(), 19)  # SIGSTOP
            os.kill(child, 18)  # SIGCONT
            continue
        break
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(1)


def _init(args: list[str]) -> None:
    (drop,) = args
    sys.path[:] = []
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        _fail(f"pivot_root's syscall number on {os.uname().machine} is not known (enter.py)")
    _check(_libc.syscall(number, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount /.old")
    os.rmdir("/.old")
    _drop_bounding_set(drop)
    os.write(1, b"ready\n")
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    _default_signals()
    os.execve("/usr/bin/tini", ["tini", "-s", "-p", "SIGKILL", "--", "/bin/sleep", "infinity"], {})


if __name__ == "__main__":
    mode, *rest = sys.argv[1:] or [""]
    try:
        if mode == "enter":
            _enter(rest)
        elif mode == "init":
            _init(rest)
        else:
            _fail("usage: enter.py enter|init ...")
    except BaseException as exc:  # no traceback: printing one may read the sandbox's files
        _fail(f"{type(exc).__name__}: {exc}")
