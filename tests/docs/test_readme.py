"""The README is a front door: short, its quick start runs as written, its links lead somewhere.

The quick start is the ``python`` block under the README's "Quick start" heading; it runs
as a file of its own under ``mpirun -n 2`` (with the environment the README tells users
to export) and must print exactly the ``text title="Output"`` block that follows it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.test_code_blocks import Block, fenced_blocks
from tests.faults.launch import MPI_ENV, MPIRUN

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 150

_LINK = re.compile(r"\]\(([^)\s]+)\)")
NUMBA_HIGHLIGHTING = "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"

# A job that makes Numba format a typing error: with highlighting on, that initialises
# colorama, whose exit handler writes an ANSI reset to a terminal (mpirun gives ranks one).
_NUMBA_JOB = """
import hpcdist
import numba

@numba.njit
def f(x):
    return x.no_such_attribute

try:
    f(1)
except numba.core.errors.TypingError:
    print("typing error")
print("done")
"""


def _text() -> str:
    return README.read_text(encoding="utf-8")


def quickstart() -> tuple[Block, str]:
    """The quick start's code block and the output the README shows for it."""
    text = _text()
    heading = re.search(r"^## Quick start.*$", text, re.M)
    assert heading, "README.md has no '## Quick start' heading"
    start_line = text[: heading.start()].count("\n") + 1
    blocks = [b for b in fenced_blocks(text, "README.md") if b.line > start_line]
    assert len(blocks) >= 2, "the quick start needs a python block and its Output block"
    code, output = blocks[0], blocks[1]
    assert code.language == "python", f"README.md line {code.line}: expected a python block"
    assert 'title="Output"' in output.info, f"README.md line {output.line}: no Output block"
    return code, output.code


def test_the_readme_has_at_most_150_lines() -> None:
    lines = len(_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_readme_links_only_to_files_of_the_repository() -> None:
    links = [link for link in _LINK.findall(_text()) if "://" not in link]
    assert len(links) >= 15, links  # the table of docs pages and the feature lines
    for link in links:
        path = link.split("#", 1)[0]
        assert not path.startswith(".."), f"README.md links outside the repository: {link}"
        assert (ROOT / path).is_file(), f"README.md links to {link}, which does not exist"


def test_the_quickstart_is_short_and_uses_multiworkermirrored_fit() -> None:
    code, expected = quickstart()
    lines = code.code.strip().splitlines()
    assert 15 <= len(lines) <= 25, len(lines)
    assert "MultiWorkerMirroredStrategy()" in code.code and ".fit(" in code.code
    assert expected.strip(), "the Output block is empty"


@pytest.mark.timeout(360)
def test_the_quickstart_runs_as_written_under_mpirun_n_2(tmp_path: Path) -> None:
    code, expected = quickstart()
    script = tmp_path / "quickstart.py"
    script.write_text(code.code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(MPI_ENV)  # the exports the README lists under "Running mpirun yourself"
    env.pop(NUMBA_HIGHLIGHTING, None)  # not one of the exports: hpcdist sets Numba's default
    command = [MPIRUN, "-n", "2", sys.executable, script.name]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the quick start did not finish in 300 s:\n{out}\n{err}")
    assert proc.returncode == 0, f"the quick start failed (exit {proc.returncode}):\n{out}\n{err}"
    printed = [line.rstrip() for line in out.splitlines() if line.strip()]
    shown = [line.rstrip() for line in expected.splitlines() if line.strip()]
    assert printed == shown, (
        f"the quick start printed something else than the README shows.\n"
        f"README:\n{expected}\nprinted:\n{out}\nstderr:\n{err}"
    )


@pytest.mark.timeout(300)
def test_a_job_ends_clean_without_the_numba_export(tmp_path: Path) -> None:
    """hpcdist turns Numba's error highlighting off unless the user set the variable."""
    import colorama  # noqa: F401  (installed with the docs extra: what made the stray reset)

    script = tmp_path / "job.py"
    script.write_text(_NUMBA_JOB, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(MPI_ENV)
    outputs = {}
    for setting in (None, ""):  # unset (hpcdist's default), and a user's own "" (highlighting)
        env.pop(NUMBA_HIGHLIGHTING, None)
        if setting is not None:
            env[NUMBA_HIGHLIGHTING] = setting
        proc = subprocess.run(
            [MPIRUN, "-n", "1", sys.executable, script.name],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs[setting] = proc.stdout
    assert outputs[None] == "typing error\ndone\n"
    assert outputs[""].endswith("\x1b[0m")  # the user's choice stands (and the check can fail)
