"""The layering is a checked rule: pure modules import no I/O library, one module each owns one."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "webhook"
# Which third-party import each module may own.
OWNERS = {
    "flask": {"app"},
    "gunicorn": {"server"},
    "cryptography": {"tls"},
    "kubernetes": {"kube"},
    "prometheus_client": {"metrics"},
}
PURE = {
    "planning",
    "patching",
    "policy",
    "quantities",
    "reviews",
    "responses",
    "decoding",
    "capacity",
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


MODULES = sorted(PACKAGE.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_only_the_owner_imports_each_io_library(path: Path) -> None:
    for library, owners in OWNERS.items():
        if library in imports(path):
            assert path.stem in owners, f"webhook/{path.name} imports {library}; only {owners} may"


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_every_module_says_what_it_owns(path: Path) -> None:
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring, f"webhook/{path.name} has no module docstring"


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_modules_do_no_io(name: str) -> None:
    found = imports(PACKAGE / f"{name}.py")
    forbidden = {"os", "socket", "subprocess", "time", "flask", "gunicorn", "kubernetes", "logging"}
    assert not found & forbidden, f"webhook/{name}.py imports {found & forbidden}"


def test_import_linter_contracts_hold() -> None:
    lint = shutil.which("lint-imports")
    assert lint, "import-linter is part of the test extras"
    done = subprocess.run(
        [lint], cwd=PACKAGE.parent, capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
