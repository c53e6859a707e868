"""Every ```python block of the documentation runs, so the docs cannot drift from the code.

Blocks are found in ``docs/**/*.md`` (any indentation, so blocks inside lists and
admonitions count). Each one runs as a script of its own, in a fresh temporary
directory:

* a first-line comment ``# mpirun -n N`` runs it on ``N`` ranks under ``mpirun``
  (``tests/faults/launch.py``'s ``run_mpi``); other blocks run with plain ``python``
  (an MPI world of one);
* ``# env: NAME=value`` comment lines at the top set environment variables;
* a block followed by a ``text`` block titled ``Output`` (````text title="Output"````)
  must print that output (doctest rules: ``...`` matches anything, whitespace
  differences are ignored).

Examples that cannot run here (shell commands, batch scripts, output) use
another fence language (``console``, ``bash``, ``text``).
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.faults.launch import MPI_ENV, run_mpi

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MPIRUN = re.compile(r"^#\s*mpirun\s+-n\s+(\d+)\s*$")
_ENV = re.compile(r"^#\s*env:\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# "# needs: torch": the block imports a framework, so it runs in `make interop-test` (after
# the frameworks are installed, `-m frameworks`), not in `make docs` (`-m "not frameworks"`).
_NEEDS = re.compile(r"^#\s*needs:\s*(\w+)\s*$")


@dataclass
class Block:
    """A fenced code block of a page."""

    page: str
    line: int
    language: str
    info: str
    code: str
    expected: str | None = None
    ranks: int = 0
    env: dict[str, str] = field(default_factory=dict)
    needs: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_blocks(text: str, page: str) -> list[Block]:
    """The fenced blocks of a Markdown text, dedented, in order.

    Example: ``fenced_blocks("```python\\nprint(1)\\n```\\n", "x.md")[0].code == "print(1)\\n"``.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group("indent")), m.group("fence"), m.group("info").strip()
        body: list[str] = []
        j = i + 1
        closing = re.compile(rf"^\s{{0,{indent + 3}}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        while j < len(lines) and not closing.match(lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        language = info.split()[0].lower() if info else ""
        blocks.append(Block(page, i + 1, language, info, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def python_blocks() -> list[Block]:
    """The Python blocks of every page, with their markers and expected output."""
    found: list[Block] = []
    for path in sorted(DOCS.rglob("*.md")):
        page = path.relative_to(DOCS).as_posix()
        blocks = fenced_blocks(path.read_text(encoding="utf-8"), page)
        for k, block in enumerate(blocks):
            if block.language not in ("python", "py"):
                continue
            for line in block.code.splitlines():
                if not line.startswith("#"):
                    break
                if m := _MPIRUN.match(line):
                    block.ranks = int(m.group(1))
                elif m := _ENV.match(line):
                    block.env[m.group(1)] = m.group(2).strip()
                elif m := _NEEDS.match(line):
                    block.needs = m.group(1)
            following = blocks[k + 1] if k + 1 < len(blocks) else None
            if following is not None and re.search(r'title="Output"', following.info):
                block.expected = following.code
            found.append(block)
    return found


BLOCKS = python_blocks()
_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(MPI_ENV)
    # Not set for the blocks: hpcdist turns Numba's error highlighting off itself (with
    # colorama installed it would write an ANSI reset after every job's output under mpirun).
    env.pop("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", None)
    env.update(extra)
    return env


def test_the_docs_have_python_blocks_some_of_them_multi_rank():
    assert len(BLOCKS) >= 20
    assert any(b.ranks >= 2 for b in BLOCKS)
    assert any(b.expected is not None for b in BLOCKS)
    # framework blocks are marked, and only those import a framework
    assert any(b.needs == "torch" for b in BLOCKS)
    for b in BLOCKS:
        imports = re.findall(r"^\s*(?:import|from)\s+(torch|jax|tensorflow)\b", b.code, re.M)
        assert not imports or b.needs, f"{b.id} imports {imports[0]}: mark it '# needs: ...'"


def test_the_block_parser():
    text = (
        "intro\n\n```python\n# mpirun -n 2\n# env: A=1\nprint(1)\n```\n\n"
        '```text title="Output"\n1\n```\n\n- item\n\n'
        "    ```python\n    x = [\n        1]\n    ```\n"
    )
    blocks = fenced_blocks(text, "t.md")
    assert [(b.line, b.language) for b in blocks] == [(3, "python"), (9, "text"), (15, "python")]
    assert blocks[2].code == "x = [\n    1]\n"


_ZYGOTE = r"""
import json, os, runpy, sys, time, traceback
import numpy, hpcdist  # imported once; MPI is not started by the import
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            out = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            err = os.open(job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(err, 2)
            sys.argv = [job["script"]]
            runpy.run_path(job["script"], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + job["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print(os.waitstatus_to_exitcode(status), flush=True)
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print(-9, flush=True)
            break
        time.sleep(0.02)
"""


# Each rank's stderr goes to stderr-<rank>.txt, so that the output compared with an Output
# block is what the ranks print (run_mpi merges mpirun's stdout and stderr).
_RANK_RUNNER = """
import os, runpy, sys
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", str(os.getpid())))
fd = os.open(f"stderr-{rank}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.dup2(fd, 2)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class Zygote:
    """A process that has imported hpcdist once and forks a fresh child for each block.

    Saves the second or so that importing numpy, Numba and hpcdist costs each block;
    every child starts from the same untouched state (MPI not yet started), so blocks
    cannot see each other. Blocks with ``# env:`` lines run as separate processes
    instead, since variables may be read at import.
    """

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_child_env({}),
        )

    def run(self, script: Path, cwd: Path, env: dict[str, str], timeout: float):
        """Run ``script`` in a forked child; ``(exit code, stdout, stderr)``, -9 on timeout."""
        import json

        out, err = cwd / "stdout.txt", cwd / "stderr.txt"
        job = {"script": str(script), "cwd": str(cwd), "env": env, "timeout": timeout}
        job.update(out=str(out), err=str(err))
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        code = int(self.proc.stdout.readline())
        return code, out.read_text(), err.read_text()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


def test_the_zygote_reports_output_failures_and_exit_codes(zygote: Zygote, tmp_path: Path):
    env = _child_env({})
    cases = {
        "ok": ("import hpcdist\nprint('hello', hpcdist.world().size)\n", 0, "hello 1"),
        "raises": ("raise ValueError('broken block')\n", 1, ""),
        "exits": ("import sys\nsys.exit(3)\n", 3, ""),
    }
    for name, (code, status, printed) in cases.items():
        work = tmp_path / name
        work.mkdir()
        script = work / "block.py"
        script.write_text(code)
        got, output, errors = zygote.run(script, work, env, timeout=60)
        assert got == status, (name, got, output, errors)
        assert output.strip() == printed, (name, output)
        if name == "raises":
            assert "ValueError: broken block" in errors


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "block",
    [pytest.param(b, marks=[pytest.mark.frameworks] if b.needs else []) for b in BLOCKS],
    ids=[b.id for b in BLOCKS],
)
def test_code_block_runs(block: Block, tmp_path: Path, zygote: Zygote):
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    env = _child_env(block.env)
    if block.ranks:
        runner = tmp_path / "run_block.py"
        runner.write_text(_RANK_RUNNER, encoding="utf-8")
        cwd = os.getcwd()
        os.chdir(tmp_path)  # the block's files land in its temporary directory
        try:
            done = run_mpi(runner, block.ranks, args=[str(script)], env=env, timeout=240)
        finally:
            os.chdir(cwd)
        errors = "".join(
            f"--- stderr of rank {p.stem.split('-')[1]}:\n{p.read_text()}"
            for p in sorted(tmp_path.glob("stderr-*.txt"))
        )
        code, output, shown = done.returncode, done.stdout, done.stdout + errors
    elif block.env:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        code, output, shown = proc.returncode, proc.stdout, proc.stdout + proc.stderr
    else:
        code, output, errors = zygote.run(script, tmp_path, env, timeout=240)
        shown = output + errors
    where = f"docs/{block.page} line {block.line}"
    assert code == 0, f"{where} failed (exit {code}):\n{shown}"
    if block.expected is not None:
        assert _CHECKER.check_output(block.expected, output, _FLAGS), (
            f"{where} printed something else than the Output block that follows it.\n"
            f"expected:\n{block.expected}\ngot:\n{output}"
        )
