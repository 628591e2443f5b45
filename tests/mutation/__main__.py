"""``python3 -m tests.mutation``: run mutmut over webhook/decision and judge the survivors.

Options: ``--max-children N`` (default: every core), ``--keep`` (judge the
results of the last run in ./mutants again, without running), ``--triage``
(print the unexplained survivors as equivalent.yaml entries to judge).
Exit 0 when every module kills at least 97% of its non-equivalent mutants
and equivalent.yaml is true, 1 when not, 2 when mutmut cannot run (or,
with ``--keep``, there is no run to judge).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

from tests import tools
from tests.mutation import COLLECT, as_yaml, judge, load_equivalents, mutants_of, parse_rows, report
from webhook.cli.args import OneLineParser

ROOT = tools.ROOT


def _workers(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of 1 or more, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python3 -m tests.mutation", description=__doc__)
    parser.add_argument("--max-children", type=_workers, default=os.cpu_count() or 1)
    parser.add_argument("--keep", action="store_true", help="judge the last run again")
    parser.add_argument("--triage", action="store_true", help="print survivors as YAML")
    args = parser.parse_args(argv)
    try:
        mutmut = tools.ensure("mutmut")
    except tools.Unavailable as err:
        print(f"mutation: {err}", file=sys.stderr)
        return 2
    env = {**os.environ, "GPUSHARE_MUTATION": "1"}
    if args.keep and not (ROOT / "mutants" / "mutmut-stats.json").exists():
        print("mutation: no run to judge again in ./mutants; run without --keep", file=sys.stderr)
        return 2
    if not args.keep:
        # A fresh run every time: mutmut reuses results for functions it
        # thinks unchanged, and cannot tell when only the tests have changed.
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        started = time.monotonic()
        with open(os.devnull, "w") as quiet:
            done = subprocess.run(
                [str(mutmut), "run", "--max-children", str(args.max_children)],
                cwd=ROOT,
                env=env,
                stdout=quiet,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
            )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            print(f"mutation: mutmut run failed (exit {done.returncode}): {last}", file=sys.stderr)
            return 2
        print(f"mutmut run: {time.monotonic() - started:.0f} s on {args.max_children} workers")
    python = mutmut.parent / "python"
    collected = subprocess.run(
        [str(python), "-c", COLLECT], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if collected.returncode != 0:
        last = (collected.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"mutation: cannot read mutmut's results: {last}", file=sys.stderr)
        return 2
    mutants = mutants_of(parse_rows(collected.stdout))
    verdict = judge(mutants, load_equivalents())
    print(report(verdict))
    if args.triage:
        print(as_yaml(verdict.unexplained))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
