"""The layering is a checked rule: packages by concern, each I/O library owned by one package.

import-linter (contracts in pyproject.toml) checks imports between the
packages; these tests check what it cannot: that every module is inside a
layer the contracts name, says what it owns, and (in the decision) does no
I/O at all, not even through the standard library.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "webhook"
MODULES = sorted(PACKAGE.rglob("*.py"))
DECISION = sorted((PACKAGE / "decision").glob("*.py"))


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layered,) = [c for c in contracts if c["type"] == "layers"]
    return [name.strip() for layer in layered["layers"] for name in layer.split("|")]


# The package itself, its __main__ and its version are the entry, above every layer.
ENTRY = {"webhook", "webhook.__main__"}


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_every_module_is_in_a_layer(path: Path) -> None:
    name = module_name(path)
    inside = [layer for layer in layers() if name == layer or name.startswith(layer + ".")]
    assert inside or name in ENTRY, (
        f"{name} is in no layer of the import-linter contracts: put it in a package "
        "(webhook.decision, webhook.serving, webhook.cluster) or add it to the layers"
    )


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_every_module_says_what_it_owns(path: Path) -> None:
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring, f"{module_name(path)} has no module docstring"


# A module past this is doing two things; split it by concern, as the
# packages are (see their docstrings).
MAX_LINES = 420


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_every_module_stays_readable(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{module_name(path)} has {lines} lines (at most {MAX_LINES})"


# A function past this is doing two things: split it into a step that
# builds and one that emits, or into named parts.
MAX_FUNCTION_LINES = 60


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_every_function_fits_a_screen(path: Path) -> None:
    long = [
        f"{node.name} ({node.lineno}): {lines} lines"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert not long, f"{module_name(path)}: over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


@pytest.mark.parametrize("path", DECISION, ids=[module_name(p) for p in DECISION])
def test_the_decision_does_no_io(path: Path) -> None:
    found = imports(path)
    forbidden = {"os", "socket", "subprocess", "time", "threading", "pathlib", "io", "ssl"}
    assert not found & forbidden, f"{module_name(path)} imports {found & forbidden}"


def test_import_linter_contracts_hold() -> None:
    lint = shutil.which("lint-imports")
    assert lint, "import-linter is part of the test extras"
    done = subprocess.run(
        [lint], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_module_map_lists_every_module_as_its_docstring_says() -> None:
    listed = dict(
        re.findall(
            r"^\| `(webhook/[^`]+\.py)` \| (.*) \|$", (ROOT / "docs/modules.md").read_text(), re.M
        )
    )
    actual = {
        str(path.relative_to(ROOT)): (ast.get_docstring(ast.parse(path.read_text())) or "").split(
            "\n"
        )[0]
        for path in MODULES
    }
    assert listed == actual, (
        "docs/modules.md is out of date: its table must list every module of webhook/ "
        "with the first line of the module's docstring"
    )
