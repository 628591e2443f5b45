"""Test tools kept out of the product's environment, each in a venv of its own.

A scanner such as checkov brings hundreds of packages, some pinned below the
versions the image ships (``kubernetes``, ``python-dateutil``): installed with
the test extras it would downgrade them, and the suite would no longer test
what the image runs. So each such tool gets its own venv, made by the test
run the first time it is needed and kept in a cache outside the work tree
(``~/.cache/gpushare-webhook/tools/<name>-<version>``;
``GPUSHARE_TOOLS_CACHE`` overrides the folder), as tests/gotools.py keeps
the Go programs, with its lock and its ``Unavailable``. A venv counts as
made only once its install has finished (a marker file written last), so
one cut short is made again.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests.gotools import Unavailable, cache_base, cached

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Tool:
    requirements: tuple[str, ...]  # what pip installs into the venv
    executable: str  # in the venv's bin/
    # Installed with the project's own constraints but for these packages
    # (None: without them): for a tool run over the project itself.
    constraints_but: tuple[str, ...] | None = None


TOOLS = {
    "checkov": Tool(("checkov==3.3.30",), "checkov"),
    # Mutation testing runs the project's tests, so its venv holds the project
    # (editable: what is mutated is the work tree) at the image's versions,
    # but for click: mutmut 3.8 needs a newer one than Flask is pinned with
    # (and mutmut 3.7 does not run under pytest 9).
    "mutmut": Tool(("mutmut==3.8.1", "-e", f"{ROOT}[test]"), "mutmut", ("click",)),
}


def cache_root() -> Path:
    return cache_base("GPUSHARE_TOOLS_CACHE", "tools")


def ensure(name: str) -> Path:
    """The path of ``name``'s executable, installing it into its venv the first time."""
    tool = TOOLS[name]
    folder = cache_root() / f"{name}-{_key(tool)}"
    made = ".complete"  # written last: a venv whose install was cut short is made again

    def install() -> float:
        # NB: made in place, not moved there: a venv's scripts name its path.
        shutil.rmtree(folder, ignore_errors=True)
        _install(folder, tool)
        (folder / made).write_text(" ".join(tool.requirements) + "\n")
        return 0.0

    cached(folder, [made], install)
    return folder / "bin" / tool.executable


def _key(tool: Tool) -> str:
    """What decides what the venv holds: its requirements, and the project's pins it takes."""
    digest = hashlib.sha256(repr(tool).encode())
    if tool.constraints_but is not None:
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        wanted = [project["dependencies"], project.get("optional-dependencies", {})]
        digest.update(repr(wanted).encode())
        digest.update((ROOT / "constraints.txt").read_bytes())
    return digest.hexdigest()[:12]


def _install(venv: Path, tool: Tool) -> None:
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    if tool.constraints_but is not None:
        pins = venv / "constraints.txt"
        venv.mkdir(parents=True, exist_ok=True)
        kept = [
            line
            for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.partition("==")[0].strip().lower() not in tool.constraints_but
        ]
        pins.write_text("\n".join(kept) + "\n")
        pip += ["-c", str(pins)]
    steps = [[sys.executable, "-m", "venv", str(venv)], [*pip, *tool.requirements]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False, timeout=900)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise Unavailable(f"cannot install {' '.join(tool.requirements)} into {venv}: {last}")
