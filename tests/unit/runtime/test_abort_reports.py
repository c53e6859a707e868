"""What a failing rank prints before the job is aborted: the first failure of a host gives the
full traceback, later ones one line each; an interrupt is one line (real processes, a fake
communicator whose ``Abort`` ends the process)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from hpcdist.errors import RankFailedError

RANK_SCRIPT = """
import os, sys
from hpcdist.runtime.abort import install_abort_on_error

class Comm:
    def Get_rank(self):
        return {rank}
    def bcast(self, value, root=0):
        return {token!r}
    def Abort(self, code):
        sys.stderr.flush()
        os._exit(code)

install_abort_on_error(Comm())
{body}
"""


def _rank(rank: int, token: str, body: str) -> subprocess.CompletedProcess:
    code = RANK_SCRIPT.format(rank=rank, token=token, body=body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.fixture
def token():
    value = uuid.uuid4().hex
    yield value
    import os
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"hpcdist-failed-{value}")
    if os.path.exists(path):
        os.remove(path)


def test_first_failure_prints_the_traceback_later_ones_one_line(token):
    first = _rank(2, token, "raise ValueError('bad shape in layer 3')")
    assert first.returncode == 1
    assert "hpcdist: rank 2: uncaught exception, aborting the job" in first.stderr
    assert "Traceback (most recent call last)" in first.stderr
    assert "ValueError: bad shape in layer 3" in first.stderr
    later = _rank(0, token, "raise ValueError('bad shape in layer 3\\nsecond line')")
    assert later.returncode == 1
    assert later.stderr == (
        "hpcdist: rank 0: ValueError: bad shape in layer 3 "
        "(rank 2 failed first; its traceback is in its output)\n"
    )


def test_an_interrupt_is_one_line_and_exit_status_130(token):
    first = _rank(1, token, "raise KeyboardInterrupt")
    assert first.returncode == 130
    assert first.stderr == (
        "hpcdist: rank 1: interrupted by SIGINT (KeyboardInterrupt), "
        "ending the job on every rank\n"
    )
    again = _rank(3, token, "raise KeyboardInterrupt")  # Ctrl-C reached every rank: quiet
    assert again.returncode == 130 and again.stderr == ""


def test_a_rank_failed_error_is_one_line_even_first(token):
    body = "from hpcdist.errors import RankFailedError\nraise RankFailedError('rank 4 has ended')"
    done = _rank(0, token, body)
    assert done.returncode == 1
    assert done.stderr == "hpcdist: rank 0: RankFailedError: rank 4 has ended\n"
    assert issubclass(RankFailedError, RuntimeError)


def test_a_thread_failure_names_the_thread(token):
    body = (
        "import threading\n"
        "t = threading.Thread(target=lambda: 1 / 0, name='loader'); t.start(); t.join()\n"
        "import time; time.sleep(5)\n"
    )
    done = _rank(1, token, body)
    assert done.returncode == 1
    assert "hpcdist: rank 1: uncaught exception in thread loader, aborting the job" in done.stderr
    assert "ZeroDivisionError" in done.stderr
