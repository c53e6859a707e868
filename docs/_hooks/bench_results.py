"""mkdocs hook: the benchmark results and SLURM scripts of the repository, in the site.

* ``benchmarks/results/*.png`` and ``*.json`` are published under ``bench/``, and
  ``slurm/*.sbatch`` under ``slurm/``, straight from the tree (nothing is copied into
  ``docs/``, so nothing goes stale).
* ``{{ slurm scripts }}`` becomes a list of links to those scripts, each with the first
  comment line of its header.
* In a page, ``{{ bench FILE PATH [FORMAT] [xSCALE] }}`` is replaced by the value at
  ``PATH`` in ``benchmarks/results/FILE``, formatted with ``FORMAT`` (a Python format
  spec, e.g. ``.2f`` or ``.1%``) after multiplying by ``SCALE``. ``PATH`` is dotted keys;
  ``name[key=value]`` picks the element of a list whose ``key`` equals ``value``
  (``name[a=1&b=x y]`` for several keys; values may hold spaces), and ``name[3]`` the
  element at an index. A missing file or key fails the build, so the numbers on the
  performance page are always those of the JSON next to the plots.

Example: ``{{ bench train_throughput.json weak_scaling_efficiency .1% }}`` gives ``88.9%``.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
SLURM = ROOT / "slurm"

_PLACEHOLDER = re.compile(r"\{\{\s*bench\s+([^}]*?)\s*\}\}")
_SELECT = re.compile(r"^([^\[\]]+)\[([^\]]*)\]$")


def on_files(files, config):
    for path in sorted(RESULTS.glob("*")):
        if path.suffix in (".png", ".json"):
            files.append(File.generated(config, f"bench/{path.name}", abs_src_path=str(path)))
    for path in sorted(SLURM.glob("*.sbatch")):
        files.append(File.generated(config, f"slurm/{path.name}", abs_src_path=str(path)))
    return files


@cache
def _load(name: str) -> Any:
    path = RESULTS / name
    if not path.is_file():
        raise PluginError(f"benchmark result {path} does not exist (run `make bench`)")
    return json.loads(path.read_text(encoding="utf-8"))


def _step(value: Any, part: str, where: str) -> Any:
    m = _SELECT.match(part)
    key, selector = (m.group(1), m.group(2)) if m else (part, None)
    if not isinstance(value, dict) or key not in value:
        raise PluginError(f"{where}: no key {key!r}")
    value = value[key]
    if selector is None:
        return value
    if not isinstance(value, list):
        raise PluginError(f"{where}: {key!r} is not a list")
    if "=" not in selector:
        return value[int(selector)]
    wanted = dict(term.split("=", 1) for term in selector.split("&"))
    for item in value:
        if isinstance(item, dict) and all(str(item.get(k)) == v for k, v in wanted.items()):
            return item
    raise PluginError(f"{where}: no element of {key!r} with {selector}")


def _words(spec: str) -> list[str]:
    """``spec`` split on spaces outside brackets."""
    words, current, depth = [], "", 0
    for char in spec:
        depth += (char == "[") - (char == "]")
        if char.isspace() and depth == 0:
            if current:
                words.append(current)
            current = ""
        else:
            current += char
    return [*words, current] if current else words


def bench_value(spec: str) -> str:
    """The text for one placeholder's ``FILE PATH [FORMAT] [xSCALE]``."""
    words = _words(spec)
    if len(words) < 2:
        raise PluginError(f"bench placeholder {spec!r}: expected FILE PATH [FORMAT] [xSCALE]")
    name, path, rest = words[0], words[1], words[2:]
    scale, fmt = 1.0, ""
    for word in rest:
        if word.startswith("x"):
            scale = float(word[1:])
        else:
            fmt = word
    value: Any = _load(name)
    # Split on dots outside brackets (selectors may contain dots, e.g. [size=1.5]).
    parts = re.findall(r"[^.\[]+(?:\[[^\]]*\])?", path)
    for part in parts:
        value = _step(value, part, f"bench placeholder {spec!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = value * scale if scale != 1.0 else value
    try:
        return format(value, fmt)
    except (TypeError, ValueError) as e:
        raise PluginError(f"bench placeholder {spec!r}: cannot format {value!r}: {e}") from None


def slurm_scripts(page_url: str) -> str:
    """A Markdown list of the ``slurm/*.sbatch`` scripts, linked, with their first comment."""
    depth = page_url.strip("/").count("/") if page_url.strip("/") else 0
    up = "../" * depth
    lines = []
    for path in sorted(SLURM.glob("*.sbatch")):
        words: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            text = line[1:].strip() if line.startswith("#") else ""
            if not text or line.startswith("#SBATCH"):
                if words:
                    break  # the end of the header's first paragraph
                continue
            words.append(text)
        about = " ".join(words)
        lines.append(f"* [`slurm/{path.name}`]({up}slurm/{path.name}): {about}")
    if not lines:
        raise PluginError(f"no SLURM batch scripts in {SLURM}")
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    markdown = markdown.replace("{{ slurm scripts }}", slurm_scripts(page.file.src_uri))
    return _PLACEHOLDER.sub(lambda m: bench_value(m.group(1)), markdown)
