"""``python -m tests.skew``: keep this release's set-up of tests.skew.CASES (see tests/skew).

Run once per release, when its version is set; an earlier release's folder
is never written again.
"""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.skew import CASES, HERE, POLICIES, kept, policies
from webhook import __version__


def main() -> int:
    folder = HERE / __version__
    if folder.exists():
        print(f"{folder} exists: a release's set-up is kept as it was made", file=sys.stderr)
        return 1
    for name, (text, cases) in policies().items():
        (folder / name).mkdir(parents=True)
        policy = folder / f"{name}.policy.yaml"
        policy.write_text(text)
        guard = subprocess.run(
            [sys.executable, "-m", "webhook", "policy", "guard", str(policy)],
            capture_output=True,
            text=True,
            check=True,
        )
        (folder / f"{name}.guard.yaml").write_text(guard.stdout)
        for case in cases:
            body = CASES[case]
            done = subprocess.run(
                [sys.executable, "-m", "webhook", "mutate", "-", "--policy", str(policy)],
                input=yaml.safe_dump(body),
                capture_output=True,
                text=True,
                check=True,
            )
            (folder / name / f"{case}.yaml").write_text(done.stdout)
    print(f"kept {len(kept(__version__))} pods under {len(POLICIES)} policies in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
