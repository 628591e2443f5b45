"""The gunicorn internals webhook.serving.worker and .drain rest on still exist, as they use them.

An upgrade of gunicorn that renames or reshapes one of them fails here, by
name, before it fails as a hung connection in the transport tests.
"""

from __future__ import annotations

import importlib
import inspect
import re
import socket
from typing import Any

import gunicorn
import pytest
from gunicorn.config import Config
from gunicorn.workers.gthread import TConn

from webhook.serving.drain import DRAIN_INTERNALS
from webhook.serving.worker import GUNICORN_INTERNALS

FIX = (
    "webhook/serving/worker.py or drain.py relies on it (see its docstring): "
    "adapt it or pin gunicorn"
)
INTERNALS = GUNICORN_INTERNALS + DRAIN_INTERNALS


def _resolve(where: str) -> Any:
    module, _, name = where.rpartition(".")
    try:
        return importlib.import_module(where)
    except ImportError:
        return getattr(importlib.import_module(module), name)


def _instance_attributes(owner: Any) -> set[str]:
    """The attributes an instance gets, for the classes whose state the worker reads."""
    if owner is TConn:
        left, right = socket.socketpair()
        with left, right:
            return set(vars(TConn(Config(), left, ("127.0.0.1", 0), None)))
    # A ThreadWorker is built only by a gunicorn arbiter: what its own
    # methods assign to self is what the worker can count on.
    return set(re.findall(r"self\.(\w+) = ", inspect.getsource(owner)))


@pytest.mark.parametrize(
    ("where", "name", "params"),
    INTERNALS,
    ids=[f"{where.rsplit('.', 1)[-1]}.{name}" for where, name, _ in INTERNALS],
)
def test_gunicorn_still_has(where: str, name: str, params: tuple[str, ...] | None) -> None:
    owner = _resolve(where)
    label = f"gunicorn {gunicorn.__version__}: {where}.{name}"
    if params is None:
        found = hasattr(owner, name) or name in _instance_attributes(owner)
        assert found, f"{label} is gone; {FIX}"
        return
    target = getattr(owner, name, None)
    assert callable(target), f"{label} is gone; {FIX}"
    takes = tuple(inspect.signature(target).parameters)[: len(params)]
    assert takes == params, f"{label} now takes {takes}, not {params}; {FIX}"
