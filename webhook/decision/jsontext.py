"""JSON text as the webhook writes it: each encoder made once, not once per call.

Owns the encoders every answer, patch, annotation and log line is written
with. ``json.dumps`` and ``JSONEncoder.encode`` build a new C encoder on
every call, which costs more than encoding a short value; an answer and
its log line encode a dozen. :func:`encoder` builds the same C encoder
once and writes exactly what ``JSONEncoder(...).encode`` with the same
options writes (tests/test_jsontext.py holds them equal).

NB: kept for a measured reason: writing every answer of the benchmark's
mix with ``json.dumps`` instead made a review (decided and written, in
process) 6 to 7.5% slower, over twice the 3% a speed-only mechanism has
to be worth here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _stdlib
from typing import Any, NamedTuple

Encode = Callable[[Any], str]


def encoder(
    *,
    ascii_only: bool = True,
    sort_keys: bool = False,
    separators: tuple[str, str] = (",", ":"),
    default: Callable[[Any], Any] | None = None,
) -> Encode:
    """An ``encode(value) -> str`` like ``JSONEncoder(...).encode``, made once.

    No check for cycles: what is encoded is trees built from parsed JSON
    or by the webhook, which have none.
    """
    portable = json.JSONEncoder(
        ensure_ascii=ascii_only,
        sort_keys=sort_keys,
        separators=separators,
        check_circular=False,
        default=default,
    )
    string = _stdlib.encode_basestring_ascii if ascii_only else _stdlib.encode_basestring
    # NB: the fallbacks write the same text, slower: no test can tell them apart.
    # pragma: no mutate start
    make: Callable[..., Any] | None = getattr(_stdlib, "c_make_encoder", None)
    if make is None:  # pragma: no cover
        return portable.encode  # a Python built without the json accelerator
    item_separator, key_separator = separators
    try:
        # The arguments JSONEncoder.iterencode passes it (CPython 3.11 to 3.14).
        chunks = make(
            None,
            portable.default,
            string,
            None,
            key_separator,
            item_separator,
            sort_keys,
            False,
            True,
        )
    except TypeError:  # pragma: no cover
        return portable.encode  # another Python's signature
    # pragma: no mutate end

    def encode(value: Any) -> str:
        if type(value) is str:
            return str(string(value))
        return "".join(chunks(value, 0))

    return encode


# The answer, the patch and what they carry: compact ASCII (see webhook.decision.patch).
compact = encoder()
# The status annotation's value: the same record always reads the same.
sorted_compact = encoder(sort_keys=True)
# A JSON string literal, quotes included, in ASCII.
string = _stdlib.encode_basestring_ascii


class Shared(NamedTuple):
    """A value many answers carry, with its compact JSON, written once.

    The prepared policy's layout and pinned variables are shared by every
    patch of a policy; ``webhook.decision.patch`` ops keep the text with
    the value, and the answer quotes it instead of writing it again.
    """

    value: Any
    text: str


def shared(value: Any) -> Shared:
    """``value`` with its text, as ``compact`` writes it (no one may change the value after)."""
    return Shared(value, compact(value))
