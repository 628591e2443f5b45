"""The node agent's loop: the shim kept installed, and the Node's label saying which one.

Owns what one round does (install or find current the library, and the
``ld.so.preload`` file with ``shim.ldSoPreload``; then make the Node's
``gpushare-webhook.io/shim`` label say the short sha256 of the library
the node holds, or remove it when the node holds none it can load) and
the loop around it, which stops on SIGTERM.

Stopping leaves the label and the library where they are. A rolling
update of the DaemonSet stops every agent in turn; taking the label off
would make each node refuse GPU pods until its new agent starts, and the
library is still on the node, mapped by the pods running there, so the
label is still true. The next agent re-checks both at once. Removing the
shim from the nodes is a step of its own (docs/node-agent.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from webhook.decision import Policy
from webhook.errors import KubeError, ShimError
from webhook.node.install import (
    Installed,
    checked_source,
    install_library,
    install_text,
    machine_of,
)

log = logging.getLogger("gpushare-webhook.node")


class Label(Protocol):
    """The Node's label, as the agent sees it (``webhook.cluster.nodelabel.NodeLabel``)."""

    def get(self) -> str | None: ...

    def set(self, value: str | None) -> None: ...


@dataclass(frozen=True)
class Target:
    """Where the shim goes: the policy's ``shim`` section, under the host directory's mount."""

    source: Path
    directory: Path  # the node's shim.hostPath, as mounted into the agent's container
    library: str
    preload: str | None  # the ld.so.preload line, with shim.ldSoPreload; else None

    @classmethod
    def of(cls, policy: Policy, *, source: Path, host_root: Path) -> Target:
        shim = policy.shim
        return cls(
            source=source,
            directory=host_root / shim.host_path.lstrip("/"),
            library=shim.library,
            preload=f"{shim.preload}\n" if shim.ld_so_preload else None,
        )


def install_shim(target: Target, *, machine: tuple[int, str] | None = None) -> Installed:
    """Install the library (and the preload file), each only when it differs."""
    done = install_library(target.source, target.directory, target.library, machine=machine)
    if target.preload is not None:
        install_text(target.directory / "ld.so.preload", target.preload)
    return done


def installed_copy(target: Target) -> Installed | None:
    """The library on the node, if it is one this node loads; None if missing or broken."""
    path = target.directory / target.library
    try:
        sha256 = checked_source(path, machine_of())
    except ShimError:
        return None
    return Installed(path, sha256, "current")


@dataclass
class Counts:
    """What the agent did since it started (logged; a node agent skips and counts)."""

    installed: int = 0
    current: int = 0
    skipped: int = 0  # rounds whose library could not be put in place
    label_errors: int = 0
    last: Installed | None = field(default=None, repr=False)


def one_round(target: Target, label: Label | None, counts: Counts) -> Installed | None:
    """Install, then label; every failure is one log line and a count, never a stop."""
    try:
        done = install_shim(target)
    except ShimError as error:
        counts.skipped += 1
        log.warning("shim not installed (skipped %d time(s)): %s", counts.skipped, error)
        # A bad source leaves a good installed copy in place, and pods may use it.
        kept = installed_copy(target)
        _label(label, kept.short if kept else None, counts)
        return None
    if done.outcome == "installed":
        counts.installed += 1
        log.info("installed %s (sha256 %s)", done.path, done.sha256)
    else:
        counts.current += 1
    counts.last = done
    _label(label, done.short, counts)
    return done


def _label(label: Label | None, value: str | None, counts: Counts) -> None:
    if label is None:
        return
    try:
        if label.get() != value:
            label.set(value)
            log.info("node label %s", f"set to {value}" if value else "removed")
    except KubeError as error:
        counts.label_errors += 1
        log.warning("node label not updated: %s", error)


def run(
    target: Target,
    label: Label | None,
    *,
    interval: float,
    stop: threading.Event,
    on_round: Callable[[Counts], None] | None = None,
) -> Counts:
    """Rounds every ``interval`` seconds until ``stop`` is set (SIGTERM sets it)."""
    machine_of()  # an architecture the shim has no build for stops here, in one line
    counts = Counts()
    while not stop.is_set():
        one_round(target, label, counts)
        if on_round is not None:
            on_round(counts)
        stop.wait(interval)
    log.info(
        "stopping; the library and the node label stay (installed %d, current %d, skipped %d)",
        counts.installed,
        counts.current,
        counts.skipped,
    )
    return counts
