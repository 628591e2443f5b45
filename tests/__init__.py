"""The test suite of gpushare-webhook.

Test processes find the tools the test extras install (kubectl,
hadolint, lint-imports) beside the interpreter that runs them, as an
activated venv would: the README runs the suite as ``.venv/bin/python -m
pytest``, with no ``activate``.
"""

import os
import sys
from pathlib import Path

_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([_BIN, os.environ.get("PATH", "")])
