"""The suite runs on the versions the image ships.

The image installs ``constraints.txt`` exactly (see the Dockerfile); the
README's test command installs the test extras under the same constraints.
A test tool that pulls a runtime dependency to another version would make
the suite test something the image does not run, so every package the
product needs at run time must be installed here at its pinned version,
and the constraints must pin every one of them.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).parent.parent


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        pin = line.split("#", 1)[0].strip()
        if pin:
            name, _, version = pin.partition("==")
            pins[_name(name)] = version
    return pins


def runtime_closure(project: str = "gpushare-webhook") -> set[str]:
    """Every distribution the product needs at run time: its requirements, transitively.

    Extras are left out (the test extras are not shipped), and each marker is
    evaluated for this interpreter, as pip does when it installs.
    """
    seen: set[str] = set()
    todo = [(project, "")]
    while todo:
        name, extra = todo.pop()
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is not None and not marker.evaluate({"extra": extra}):
                continue
            key = _name(requirement.name)
            if key not in seen:
                seen.add(key)
                todo.extend((key, e) for e in ["", *sorted(requirement.extras)])
    return seen


def test_every_runtime_dependency_is_pinned() -> None:
    missing = sorted(runtime_closure() - pinned().keys())
    assert missing == [], (
        f"{missing} are runtime dependencies that constraints.txt does not pin; "
        "regenerate it from a fresh venv (see its first lines)"
    )


def test_the_test_environment_holds_the_pinned_runtime_versions() -> None:
    pins = pinned()
    wrong = {
        name: f"installed {metadata.version(name)}, image pins {pins[name]}"
        for name in sorted(runtime_closure())
        if name in pins and metadata.version(name) != pins[name]
    }
    assert wrong == {}, (
        "install the tests as the README says (pip install -c constraints.txt -e '.[test]'); "
        f"a test tool moved these runtime dependencies: {wrong}"
    )


def test_constraints_pin_nothing_the_product_no_longer_needs() -> None:
    stale = sorted(pinned().keys() - runtime_closure())
    assert stale == [], f"constraints.txt pins {stale}, which the product does not need"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Two commands", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, commands
    assert "-c constraints.txt" in commands[1]
    assert commands[1] in (ROOT / ".ci/run").read_text().splitlines()
