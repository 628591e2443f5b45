"""Mutation testing of the decision: ``python3 -m tests.mutation`` (docs/mutation.md).

mutmut (in a venv of its own, tests/tools.py) changes ``webhook/decision``
one small edit at a time, a ``<`` for a ``<=``, a ``break`` for a
``continue``, a string for another, and runs the tests that reach the
changed function (the selection in pyproject.toml's ``[tool.mutmut]``).
A mutant no test fails on is a rule the suite would not notice breaking.

Some survivors cannot be killed because they change nothing a caller can
see: a shortcut taken for speed, a guard for a shape the API server never
sends, a message nobody reads. Each of those is listed in
``equivalent.yaml`` with the reason it is harmless, keyed by the function
and the changed lines (not by mutmut's numbering, which shifts when a
function is edited). The run fails when any module of the decision kills
fewer than ``THRESHOLD`` of its other mutants, or when an entry of
``equivalent.yaml`` no longer matches a survivor (the list must stay true).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
EQUIVALENT = HERE / "equivalent.yaml"
THRESHOLD = 0.97

# mutmut's statuses: a mutant is killed when a test failed, timed out or
# crashed with it; "no tests" and "suspicious" count as survivors.
KILLED = frozenset({"killed", "timeout", "caught by type check", "segfault"})


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's: webhook.decision.checks.x_check_env__mutmut_3
    status: str
    was: str  # the changed lines of the function, stripped, as in the source
    now: str  # the same lines in the mutant

    @property
    def module(self) -> str:
        return self.name.split(".x", 1)[0].replace(".", "/") + ".py"

    @property
    def function(self) -> str:
        """The dotted name of the mutated function: ``webhook.decision.admission.Result.encode``."""
        module, _, mangled = self.name.partition(".x")
        mangled = mangled.removeprefix("_").rsplit("__mutmut_", 1)[0]
        return module + "." + mangled.replace("ǁ", ".").strip(".")

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.function, self.was, self.now)


@dataclass(frozen=True)
class Equivalent:
    function: str
    was: str
    now: str
    reason: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.function, self.was, self.now)


@dataclass(frozen=True)
class Score:
    module: str
    mutants: int
    killed: int
    equivalent: int

    @property
    def survived(self) -> int:
        return self.mutants - self.killed - self.equivalent

    @property
    def ratio(self) -> float:
        judged = self.mutants - self.equivalent
        return self.killed / judged if judged else 1.0


def load_equivalents(path: Path = EQUIVALENT) -> list[Equivalent]:
    """``equivalent.yaml``: a list of {function, was, now, reason}."""
    entries = yaml.safe_load(path.read_text()) or []
    return [Equivalent(e["function"], str(e["was"]), str(e["now"]), e["reason"]) for e in entries]


def mutants_of(rows: Iterable[Mapping[str, Any]]) -> list[Mutant]:
    """Mutants from the collector's JSON rows (name, status, diff lines)."""
    found = []
    for row in rows:
        was = [line[1:].strip() for line in row["changed"] if line.startswith("-")]
        now = [line[1:].strip() for line in row["changed"] if line.startswith("+")]
        found.append(Mutant(row["name"], row["status"], "\n".join(was), "\n".join(now)))
    return found


@dataclass(frozen=True)
class Verdict:
    scores: list[Score]
    unexplained: list[Mutant]  # survivors not judged equivalent
    stale: list[Equivalent]  # entries no survivor matches

    @property
    def failing(self) -> list[Score]:
        return [s for s in self.scores if s.ratio < THRESHOLD]

    @property
    def ok(self) -> bool:
        return not self.failing and not self.stale


def judge(mutants: Sequence[Mutant], equivalents: Sequence[Equivalent]) -> Verdict:
    known = {e.key for e in equivalents}
    survivors = [m for m in mutants if m.status not in KILLED]
    matched = {m.key for m in survivors if m.key in known}
    totals: Counter[str] = Counter(m.module for m in mutants)
    killed: Counter[str] = Counter(m.module for m in mutants if m.status in KILLED)
    excused: Counter[str] = Counter(m.module for m in survivors if m.key in known)
    scores = [Score(mod, totals[mod], killed[mod], excused[mod]) for mod in sorted(totals)]
    return Verdict(
        scores=scores,
        unexplained=[m for m in survivors if m.key not in known],
        stale=[e for e in equivalents if e.key not in matched],
    )


def _percent(ratio: float) -> str:
    """Rounded down: 100.0% only when every mutant is killed."""
    return f"{math.floor(ratio * 1000) / 10:.1f}%"


def report(verdict: Verdict) -> str:
    lines = [f"{'module':34} {'mutants':>7} {'killed':>7} {'equiv.':>7} {'left':>5} {'score':>7}"]
    for s in verdict.scores:
        flag = "" if s.ratio >= THRESHOLD else f"  below {THRESHOLD:.0%}"
        lines.append(
            f"{s.module:34} {s.mutants:7} {s.killed:7} {s.equivalent:7} {s.survived:5} "
            f"{_percent(s.ratio):>7}{flag}"
        )
    total = Score(
        "all",
        sum(s.mutants for s in verdict.scores),
        sum(s.killed for s in verdict.scores),
        sum(s.equivalent for s in verdict.scores),
    )
    lines.append(
        f"{'all':34} {total.mutants:7} {total.killed:7} {total.equivalent:7} "
        f"{total.survived:5} {_percent(total.ratio):>7}"
    )
    for m in verdict.unexplained:
        lines.append(f"survived: {m.name} ({m.status})")
        lines.extend(f"  - {line}" for line in m.was.splitlines())
        lines.extend(f"  + {line}" for line in m.now.splitlines())
    for e in verdict.stale:
        lines.append(
            f"stale: {e.function}: no survivor changes {e.was!r} to {e.now!r};"
            " remove it from tests/mutation/equivalent.yaml"
        )
    return "\n".join(lines)


def as_yaml(mutants: Sequence[Mutant]) -> str:
    """Survivors as equivalent.yaml entries to fill in, for ``--triage``."""
    rows = [{"function": m.function, "was": m.was, "now": m.now, "reason": "TODO"} for m in mutants]
    return yaml.safe_dump(rows, sort_keys=False, allow_unicode=True, width=200)


# Run with mutmut's venv python in the project's folder after ``mutmut run``:
# prints every mutant as {name, status, changed} (the diff's changed lines).
COLLECT = """
import json, sys
from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
from mutmut.utils.file_utils import walk_mutatable_files
rows = []
for path in walk_mutatable_files():
    data = SourceFileMutationData(path=path)
    data.load()
    for name, code in sorted(data.exit_code_by_key.items()):
        status = status_by_exit_code[code]
        diff = get_diff_for_mutant(name, path=path) if status not in ("killed",) else ""
        changed = [
            line for line in diff.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))
        ]
        rows.append({"name": name, "status": status, "changed": changed})
json.dump(rows, sys.stdout)
"""


def parse_rows(text: str) -> list[dict[str, Any]]:
    rows = json.loads(text)
    if not isinstance(rows, list):
        raise ValueError("the collector printed something other than a list")
    return rows
