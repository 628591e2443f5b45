"""The mutation run's judging (tests/mutation) and its baseline, without running mutmut.

``python3 -m tests.mutation`` runs mutmut (in CI too); here, in the
ordinary suite, what it judges with: scores per module, survivors matched
to equivalent.yaml by function and changed lines, and equivalent.yaml
itself kept true to the code (each entry's function exists and still holds
the lines it says a mutant changes, and says why the change is harmless).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.mutation import (
    THRESHOLD,
    Equivalent,
    Mutant,
    as_yaml,
    judge,
    load_equivalents,
    mutants_of,
    report,
)


def rows(*found: tuple[str, str, list[str]]) -> list[Mutant]:
    return mutants_of([{"name": n, "status": s, "changed": c} for n, s, c in found])


def test_a_mutant_names_its_module_and_function() -> None:
    (plain, method) = rows(
        ("webhook.decision.checks.x_check_env__mutmut_3", "killed", []),
        ("webhook.decision.admission.xǁResultǁencode__mutmut_12", "survived", []),
    )
    assert (plain.module, plain.function) == (
        "webhook/decision/checks.py",
        "webhook.decision.checks.check_env",
    )
    assert method.function == "webhook.decision.admission.Result.encode"
    (private,) = rows(("webhook.decision.asks.x__ask__mutmut_1", "killed", []))
    assert private.function == "webhook.decision.asks._ask"


def test_survivors_are_matched_by_function_and_changed_lines() -> None:
    found = rows(
        ("m.x_f__mutmut_1", "killed", []),
        ("m.x_f__mutmut_2", "survived", ["-    if a < 1:", "+    if a <= 1:"]),
        ("m.x_f__mutmut_3", "no tests", ["-    return x", "+    return None"]),
        ("m.x_f__mutmut_4", "timeout", []),
    )
    equivalent = [
        Equivalent("m.f", "if a < 1:", "if a <= 1:", "a is never 1"),
        Equivalent("m.g", "x", "y", "gone"),
    ]
    verdict = judge(found, equivalent)
    (score,) = verdict.scores
    assert (score.mutants, score.killed, score.equivalent, score.survived) == (4, 2, 1, 1)
    assert score.ratio == pytest.approx(2 / 3)
    assert [m.name for m in verdict.unexplained] == ["m.x_f__mutmut_3"]
    assert [e.function for e in verdict.stale] == ["m.g"]
    assert not verdict.ok
    text = report(verdict)
    assert "below 97%" in text
    assert "survived: m.x_f__mutmut_3 (no tests)" in text
    assert "stale: m.g" in text
    assert "reason: TODO" in as_yaml(verdict.unexplained)


def test_a_module_at_the_threshold_passes() -> None:
    found = rows(*[(f"m.x_f__mutmut_{i}", "killed", []) for i in range(97)]) + rows(
        *[(f"m.x_f__mutmut_{i}", "survived", ["-a", "+b"]) for i in range(97, 100)]
    )
    verdict = judge(found, [])
    assert verdict.scores[0].ratio == THRESHOLD
    assert verdict.ok


EQUIVALENTS = load_equivalents()


def _source_of(function: str) -> str:
    module_name, _, name = function.rpartition(".")
    try:
        return inspect.getsource(getattr(importlib.import_module(module_name), name))
    except ModuleNotFoundError:  # a method: webhook.decision.admission.Result.encode
        owner_module, _, owner = module_name.rpartition(".")
        kind = getattr(importlib.import_module(owner_module), owner)
        return inspect.getsource(getattr(kind, name))


@pytest.mark.parametrize(
    "entry", EQUIVALENTS, ids=[f"{e.function}:{e.was[:30]}" for e in EQUIVALENTS]
)
def test_each_equivalent_mutant_is_still_in_the_code_and_says_why(entry: Equivalent) -> None:
    source = _source_of(entry.function)
    lines = {line.strip() for line in source.splitlines()}
    for line in entry.was.splitlines():
        assert line in lines, f"{entry.function} no longer holds {line!r}"
    assert entry.reason not in ("", "TODO"), "each entry says why the change is harmless"
    assert "\n" not in entry.reason, "in one line"
    assert len(entry.reason) <= 160, "in one line"


def test_no_mutant_is_listed_twice() -> None:
    keys = [e.key for e in EQUIVALENTS]
    assert len(keys) == len(set(keys))


def test_the_mutation_config_selects_only_tests_that_run_in_process() -> None:
    # The selection runs once per mutant: a server or a tool started there
    # would cost minutes. What each test starts is read from its fixtures.
    root = Path(__file__).parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    for selected in config["pytest_add_cli_args_test_selection"]:
        path, _, name = selected.partition("::")
        tree = ast.parse((root / path).read_text())
        functions = [
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef)
            and node.name.startswith("test_")
            and (not name or node.name == name)
        ]
        assert functions, selected
        for function in functions:
            arguments = {arg.arg for arg in function.args.args}
            slow = {"server", "pki", "helm", "helm3", "promtool", "plane", "installed", "binaries"}
            assert not arguments & slow, f"{path}::{function.name} starts a server or a tool"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-children", "0"], "argument --max-children: a whole number of 1 or more, got '0'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_careless_command_line_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.mutation", *args],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    prog = "python3 -m tests.mutation"
    assert done.stderr == f"{prog}: {message} (see {prog} --help)\n"
