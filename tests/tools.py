"""Test tools kept out of the product's environment, each in a venv of its own.

A scanner such as checkov brings hundreds of packages, some pinned below the
versions the image ships (``kubernetes``, ``python-dateutil``): installed with
the test extras it would downgrade them, and the suite would no longer test
what the image runs. So each such tool gets its own venv, made by the test
run the first time it is needed and kept in a cache outside the work tree
(``~/.cache/gpushare-webhook/tools/<name>-<version>``;
``GPUSHARE_TOOLS_CACHE`` overrides the folder). Concurrent runs wait on a
file lock for one install; a venv counts as made only once its install has
finished (a marker file written last), so one cut short is made again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

# name -> (pip requirement, executable inside the venv)
TOOLS = {
    "checkov": ("checkov==3.3.30", "checkov"),
}


class Unavailable(Exception):
    """A tool could not be installed; the message is one line saying why."""


def cache_root() -> Path:
    override = os.environ.get("GPUSHARE_TOOLS_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpushare-webhook" / "tools"


def ensure(name: str) -> Path:
    """The path of ``name``'s executable, installing it into its venv the first time."""
    requirement, executable = TOOLS[name]
    root = cache_root()
    folder = root / requirement.replace("==", "-")
    tool = folder / "bin" / executable
    made = folder / ".complete"
    if made.exists():
        return tool
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if made.exists():  # another run made it while this one waited
            return tool
        # NB: made in place, not moved there: a venv's scripts name its path.
        shutil.rmtree(folder, ignore_errors=True)
        _install(folder, requirement)
        made.write_text(requirement + "\n")
    return tool


def _install(venv: Path, requirement: str) -> None:
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False, timeout=900)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise Unavailable(f"cannot install {requirement} into {venv}: {last}")
