"""cluster/start_retry.py: a local Ray start that missed the raylet's 30 s window is tried once
more, after the processes the failed attempt left behind are ended (real child processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cluster.start_retry import START_TRIES, children, end_processes, init_with_retry

TIMEOUT = Exception("The current node timed out during startup. This could happen because "
                    "some of the raylet failed to startup or the GCS has become overloaded.")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (not yet reaped) is not alive
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")


@needs_proc
def test_children_lists_this_process_children():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert p.pid in children()
        assert p.pid not in children(pid=1) or os.getpid() == 1
    finally:
        p.kill()
        p.wait()
    assert p.pid not in children()


def test_children_without_proc_is_none(tmp_path):
    assert children(proc=str(tmp_path / "nope")) is None


@needs_proc
def test_a_startup_timeout_ends_the_attempts_processes_and_tries_again():
    """The first attempt starts a process (as ray.init starts the GCS and the raylet) and then
    times out: that process is ended, one that was there before is left alone, and the second
    attempt's answer is returned."""
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    left: list[subprocess.Popen] = []
    calls, said = [], []

    def init():
        calls.append(1)
        if len(calls) == 1:
            left.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
            raise TIMEOUT
        return "connected"

    try:
        assert init_with_retry(init, log=said.append) == "connected"
        assert len(calls) == 2
        assert not _alive(left[0].pid)
        assert _alive(before.pid)
        assert said and "30 s" in said[0] and "(2/2)" in said[0]
    finally:
        for p in [before, *left]:
            p.kill()
            p.wait()


@pytest.mark.parametrize("err", [RuntimeError("port 6379 in use"), ValueError("bad num_cpus")])
def test_other_errors_are_raised_at_once(err):
    calls = []

    def init():
        calls.append(1)
        raise err

    with pytest.raises(type(err)):
        init_with_retry(init, list_children=lambda: set(), end=lambda pids: None)
    assert len(calls) == 1


def test_a_second_timeout_is_raised():
    calls, ended = [], []

    def init():
        calls.append(1)
        raise TIMEOUT

    with pytest.raises(Exception, match="timed out during startup"):
        init_with_retry(init, list_children=lambda: {1, 2, len(calls) + 10},
                        end=ended.append)
    assert len(calls) == START_TRIES == 2
    assert ended == [{11}]  # only what the first attempt started; the last is raised


def test_without_proc_a_timeout_is_not_retried():
    """Nothing can tell which processes the attempt left: a second start could collide."""
    calls = []

    def init():
        calls.append(1)
        raise TIMEOUT

    with pytest.raises(Exception, match="timed out"):
        init_with_retry(init, list_children=lambda: None)
    assert len(calls) == 1


def test_end_processes_skips_gone_pids():
    sent = []

    def kill(pid, sig):
        sent.append(pid)
        raise ProcessLookupError

    end_processes({999_999_991}, wait_s=0.1, kill=kill)
    assert sent == [999_999_991]
