"""Every error the webhook raises on purpose, in one place.

The hierarchy::

    WebhookError                 anything the project raises deliberately
    ├── PolicyError              a policy document is invalid (names the key)
    ├── ReviewError              an HTTP body is not an AdmissionReview (HTTP 400)
    ├── PodError                 a pod cannot be admitted (allowed: false)
    │   ├── QuantityError        a resource quantity is malformed or out of range
    │   └── ShapeError           a field of the object has the wrong JSON type
    ├── InputError               the offline CLI cannot read its input (exit 2)
    ├── CertificateError         a certificate or key is missing, expired or mismatched
    ├── KubeError                the Kubernetes API refused a call or cannot be reached
    ├── ShimError                the shim library to install is missing or not one the node loads
    ├── RegionError              a container's accounting region cannot be written as asked
    └── SnapshotError            the node watch's snapshot file is not one it wrote

Messages are written for the person who will read them in ``kubectl`` output
or a log line: they name the object, the field, the value and the fix.
"""

from __future__ import annotations

from webhook.reasons import Reason


class WebhookError(Exception):
    """Base of every deliberate error of gpushare-webhook."""


class PolicyError(WebhookError):
    """The policy document is invalid; the message names the key and what is allowed."""


class ReviewError(WebhookError):
    """The request body is not a usable AdmissionReview: answered with HTTP 400."""


class PodError(WebhookError):
    """The pod cannot be admitted as it is; the message says why and what to change.

    ``reason`` is its label in the log, the metrics and the audit annotation
    (for example ``Reason.EXCEEDS_GPU``).
    """

    def __init__(self, message: str, *, reason: Reason, code: int = 403) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


class QuantityError(PodError):
    """A GPU resource quantity is malformed, fractional, non-positive or mistyped."""

    def __init__(self, message: str, *, reason: Reason = Reason.BAD_QUANTITY) -> None:
        super().__init__(message, reason=reason, code=403)


class ShapeError(PodError):
    """A field of the submitted object has the wrong JSON type."""

    def __init__(self, path: str, expected: str, got: object) -> None:
        super().__init__(
            shape_message(path, expected, got),
            reason=Reason.MALFORMED_OBJECT,
            code=400,
        )
        self.path = path


class InputError(WebhookError):
    """The offline CLI cannot read or parse its input."""


class CertificateError(WebhookError):
    """A certificate or key file is missing, unreadable, expired or does not match."""


class KubeError(WebhookError):
    """The Kubernetes API refused or could not be reached; the message says what to fix."""


class ShimError(WebhookError):
    """The node agent cannot install the shim: the source is missing, not an ELF, another arch."""


class RegionError(WebhookError):
    """The init step cannot write a region: bad limits, another version, a file it cannot open."""


class SnapshotError(WebhookError):
    """The node snapshot a worker reads is not one the node watch wrote (kept: the last good)."""


def shape_message(path: str, expected: str, got: object) -> str:
    """What a field of the wrong JSON type is told: its path, what it must be, what it is."""
    return f"{path}: expected {expected}, got {_json_type(got)}"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
