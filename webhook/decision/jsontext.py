"""JSON text as the webhook writes it: the answer, the patch, the status annotation, the log.

Owns the few ways the webhook writes JSON, each an encoder made once with
its options: compact ASCII for the answer and its patch (a value may hold
a lone surrogate, which has no UTF-8 form; escaped, it goes back as it
came), the same with sorted keys for the status annotation (the same
record always reads the same), and an encoder a caller makes with its own
options (the log line).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Encode = Callable[[Any], str]


def encoder(
    *,
    ascii_only: bool = True,
    sort_keys: bool = False,
    separators: tuple[str, str] = (",", ":"),
    default: Callable[[Any], Any] | None = None,
) -> Encode:
    """An ``encode(value) -> str`` with these options (no cycle check: JSON trees have none)."""
    return json.JSONEncoder(
        ensure_ascii=ascii_only,
        sort_keys=sort_keys,
        separators=separators,
        check_circular=False,
        default=default,
    ).encode


# The answer, the patch and what they carry: compact ASCII (see webhook.decision.patch).
compact = encoder()
# The status annotation's value: the same record always reads the same.
sorted_compact = encoder(sort_keys=True)
