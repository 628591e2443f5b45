"""The GPU nodes as a worker knows them: the node watch's snapshot file, followed.

The server's one node watch (``webhook.cluster.watchprocess``, a process of its
own) replaces a snapshot file whenever what it knows changes; each worker
follows that file with the rule the policy follows (``webhook.serving.reload``:
looked at every ``interval``, the last good snapshot kept if one cannot be
read), and prepares the policy once per snapshot and policy
(``webhook.decision.prepared.Prepared``, which keeps the bounds of each
placement). Under ``scheduler: dra`` the GPUs are the ResourceSlices'
devices the snapshot carries beside the Nodes (``decode_snapshot``). No worker
imports the kubernetes client or talks to the API. The watch's count of
claim templates made and refused lives in a small JSON file of its own
(``templates``), read at scrape time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path

from webhook.decision import (
    DraFacts,
    Kept,
    NodeFacts,
    NodeStatus,
    Policy,
    Prepared,
    decode_snapshot,
    prepare,
)
from webhook.errors import SnapshotError
from webhook.serving.reload import WatchedFiles, replaced

log = logging.getLogger("gpushare_webhook.nodes")
STOPPED = "the node watch process has stopped; the nodes known before stay in force"

Snapshot = tuple[NodeStatus, tuple[NodeFacts, ...], DraFacts]


def _load(path: Path) -> Snapshot:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read the node snapshot: {error.strerror}") from None
    return decode_snapshot(data)


class SharedNodes:
    """A NodeSource that reads the node watch's snapshot file.

    ``alive`` tells whether the watch's keeper still runs: once it has
    ended, nothing will update the file again, and the status says so.
    """

    def __init__(
        self,
        path: Path,
        *,
        alive: Callable[[], bool] = lambda: True,
        interval: float = 0.25,
        templates: Path | None = None,
    ) -> None:
        self.path, self.templates_path = path, templates
        self._alive = alive
        self._file: WatchedFiles[Snapshot] = WatchedFiles(
            [path],
            lambda: _load(path),
            errors=(SnapshotError,),
            interval=interval,
            changed=replaced,
            on_error=lambda error: log.error("node snapshot not read, keeping the last: %s", error),
        )
        self._kept = Kept()

    def liveness(self) -> tuple[bool, str]:
        """For /healthz: a server whose node watch is gone for good should be restarted."""
        if self._alive():
            return True, "ok"
        return False, "the node watch process has stopped; restart the server"

    def status(self) -> NodeStatus:
        status = self._file.get()[0]
        if not self._alive():
            return dataclasses.replace(status, connected=False, problem=STOPPED)
        return status

    def prepared(self, policy: Policy) -> Prepared:
        snapshot, last = self._file.get(), self._kept.last
        view = self._kept.get(
            policy, snapshot, lambda: prepare(snapshot[1], snapshot[0], policy, snapshot[2])
        )
        if view is last:
            return view
        if view.uncounted and (last is None or last.uncounted != view.uncounted):
            log.warning(
                "%d node(s) report %s but no %s, so %s places no GPU pod on them: %s; "
                "the GPU-share device plugin reports both",
                len(view.uncounted),
                policy.resource_name,
                policy.multi_gpu.resource_name,
                policy.placed_by.title,
                ", ".join(view.uncounted[:10]) + (", ..." if len(view.uncounted) > 10 else ""),
            )
        return view

    def templates(self) -> dict[str, int]:
        """The watch's claim templates: ``created`` and ``failures`` (creates refused), so far."""
        try:
            found = json.loads(self.templates_path.read_bytes()) if self.templates_path else {}
        except (OSError, ValueError):
            found = {}  # not written yet: none made
        if not isinstance(found, dict):
            found = {}
        return {k: int(found.get(k) or 0) for k in ("created", "failures")}
