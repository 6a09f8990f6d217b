"""``AttemptLog``: the part of a grader's log files one attempt wrote (real files)."""

from __future__ import annotations

from legato_pipelines.desktops.osworld_worker.grader_log import AttemptLog


def test_an_attempt_takes_what_was_written_since_its_marks(tmp_path):
    first, second = tmp_path / "worker-1.log", tmp_path / "worker-2.log"
    first.write_bytes(b"start-up of worker 1\n")
    log = AttemptLog()
    log.start(first)  # the setup: worker 1's part begins after its start-up
    with first.open("ab") as fh:
        fh.write(b"setup step 0 failed\n")
    log.mark(second)  # a fresh worker grades: its file does not exist yet
    log.mark(first)  # marked already: its part still begins where the setup's did
    second.write_bytes(b"Traceback: the metric raised\n")
    assert log.paths == [str(first), str(second)]
    assert log.take() == (
        b"==> worker-1.log <==\nsetup step 0 failed\n"
        b"==> worker-2.log <==\nTraceback: the metric raised\n"
    )
    assert log.take() is None and log.paths == []  # taken once


def test_a_long_log_keeps_its_end_and_says_what_was_cut(tmp_path):
    path = tmp_path / "osworld-0.log"
    path.write_bytes(b"earlier attempt\n")
    log = AttemptLog()
    log.start(path)
    with path.open("ab") as fh:
        fh.write(b"x" * 100 + b"the error at the end\n")
    kept = log.take(limit=40)
    assert kept.endswith(b"the error at the end\n")
    assert kept.startswith(b"[legato: the first 81 bytes of this log were cut]\n")
    assert b"earlier attempt" not in kept


def test_nothing_written_or_nothing_marked_is_no_log(tmp_path):
    log = AttemptLog()
    assert log.take() is None
    path = tmp_path / "quiet.log"
    path.write_bytes(b"before\n")
    log.start(path)
    assert log.take() is None
    log.start(None)  # a worker that logs nowhere
    assert log.take() is None
