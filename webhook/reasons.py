"""Why an answer is what it is: the closed set of reasons, each stated once.

A reason is a stable label, stated on the decision (or, for a body that is
no AdmissionReview or a bug, on the admission's result) and read from there
by the log line, the ``reason`` label of the reviews metric and the audit
annotation, so the three cannot disagree. Operators alert and filter on
these texts: a new reason is a new member here, and a renamed one breaks
their queries.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Every reason an answer carries, as its label."""

    # Set up, or found already set up.
    MUTATED = "mutated"
    UNCHANGED = "unchanged"
    # Not the webhook's to shape: admitted as it came.
    NOT_A_POD = "not-a-pod"
    SUBRESOURCE = "subresource"
    NOT_CREATE = "not-create"
    EXCLUDED_NAMESPACE = "excluded-namespace"
    NO_GPU_REQUEST = "no-gpu-request"
    EPHEMERAL_ALLOWED = "ephemeral-allowed"
    # Refused (or, under warn, would be): where the pod may run.
    NODE_NAME = "node-name"
    SCHEDULER_NAME = "scheduler-name"
    # ... how it could reach the GPUs around the shim.
    HOST_PID = "host-pid"
    PRIVILEGED = "privileged"
    SYS_ADMIN = "sys-admin"
    VISIBLE_DEVICES = "visible-devices"
    # ... what it asks for.
    EXCEEDS_GPU = "exceeds-gpu"
    TOO_MANY_GPUS = "too-many-gpus"
    EXCEEDS_COMPUTE = "exceeds-compute"
    INIT_EXCEEDS_RESERVATION = "init-exceeds-reservation"
    OFF_GRID = "off-grid"
    REQUEST_WITHOUT_LIMIT = "request-without-limit"
    REQUEST_DIFFERS = "request-differs"
    COUNT_AS_LABEL = "count-as-label"
    COUNT_AS_RESOURCE = "count-as-resource"
    SHARE_WITHOUT_MEMORY = "share-without-memory"
    MULTI_GPU_UNSUPPORTED = "multi-gpu-unsupported"
    UNEVEN_SPLIT = "uneven-split"
    # ... how it writes a quantity.
    BAD_QUANTITY = "bad-quantity"
    UNIT_CONFUSION = "unit-confusion"
    NON_POSITIVE = "non-positive"
    FRACTIONAL = "fractional"
    OUT_OF_RANGE = "out-of-range"
    # ... what the webhook would add clashing with the pod's own.
    RESERVED_VOLUME = "reserved-volume"
    SHIM_HOST_PATH = "shim-host-path"
    SHIM_MOUNT = "shim-mount"
    PRELOAD_VALUE_FROM = "preload-value-from"
    # ... a field of the wrong JSON type.
    MALFORMED_OBJECT = "malformed-object"
    # No decision: the body is no AdmissionReview (HTTP 400), or a bug (a refusal, code 500).
    BAD_REQUEST = "bad-request"
    INTERNAL = "internal"
