"""Kubernetes resource quantities, and the whole-number rule for GPU resources.

Owns the quantity grammar of ``k8s.io/apimachinery/pkg/api/resource``
(``<signedNumber><suffix>`` with binary-SI, decimal-SI and exponent
suffixes) and the checks that turn a quantity into a count of GPU units. It
does no I/O and knows nothing of pods beyond the words used in messages.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from webhook.errors import QuantityError
from webhook.reasons import Reason

MemoryUnit = Literal["GiB", "MiB"]  # what one count of the memory resource is
MIB_PER_UNIT: dict[MemoryUnit, int] = {"GiB": 1024, "MiB": 1}
BYTES_PER_MIB = 2**20

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_GRAMMAR = re.compile(
    r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?\d+)|(?P<decimal>[numkMGTPE]?))"
)
# The apiserver caps quantities far below this; the cap only keeps
# "1e999999999" from making a number with a billion digits.
_MAX_EXPONENT = 30
_MAX_TEXT = 64


@dataclass(frozen=True)
class Quantity:
    """A parsed quantity: its exact value and the suffix it was written with."""

    text: str
    value: Fraction
    suffix: str

    @property
    def has_byte_suffix(self) -> bool:
        """True for suffixes (k, M, Gi, ...) that scale the number by 1000 or 1024 or more."""
        return self.suffix in _BINARY or self.suffix in {"k", "M", "G", "T", "P", "E"}


def _plain_integer(raw: object) -> int | None:
    """The value of a short string of ASCII digits ("4"), the form nearly every GPU
    quantity takes; None for anything else, which takes the full grammar."""
    if type(raw) is str and len(raw) <= 18 and raw.isascii() and raw.isdigit():
        return int(raw)
    return None


def plain_count(raw: object, maximum: int | None = None) -> int | None:
    """The count of a quantity written as a plain positive integer ("4") within
    ``maximum``; None when :func:`whole_count` has to look closer (and explain)."""
    count = _plain_integer(raw)
    if count is not None and count > 0 and (maximum is None or count <= maximum):
        return count
    return None


def parse_quantity(raw: object) -> Quantity:
    """Parse a quantity as the apiserver would, from a JSON string or number.

    Raises QuantityError (with a message lacking the container, which callers
    add) when the value does not follow the grammar.
    """
    plain = _plain_integer(raw)
    if plain is not None:
        return Quantity(text=str(raw), value=Fraction(plain), suffix="")
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise QuantityError(f'{raw!r} is not a quantity (use a string such as "4")')
    text = raw if isinstance(raw, str) else repr(raw)
    if isinstance(raw, float) and not math.isfinite(raw):
        raise QuantityError(f"{text} is not a quantity")
    if len(text) > _MAX_TEXT:
        raise QuantityError(f"{text[:20]!r}... is not a quantity (too long)")
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity")
    number = Fraction(match["number"])
    if match["binary"]:
        suffix = match["binary"]
        value = number * _BINARY[suffix]
    elif match["exp"] is not None:
        exponent = int(match["exp"])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{text!r} is out of range")
        suffix = "e"
        value = number * Fraction(10) ** exponent
    else:
        suffix = match["decimal"] or ""
        value = number * _DECIMAL[suffix]
    return Quantity(text=text, value=value, suffix=suffix)


def format_units(value: Fraction | int) -> str:
    """Render an exact number the way a person would type it."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


def whole_count(
    raw: object,
    *,
    what: str,
    unit_word: str,
    maximum: int | None = None,
    byte_unit: MemoryUnit | None = None,
) -> int:
    """Turn a quantity into a positive whole count, or explain what is wrong.

    ``what`` names the place (container and resource) for the message;
    ``unit_word`` says what one unit counts ("GiB", "percent", "GPUs").
    ``byte_unit`` is set for memory resources: it lets the message catch the
    common slip of writing a byte quantity ("4Gi") where units are counted.
    Callers on a hot path try :func:`plain_count` first, before they build
    ``what``.
    """
    try:
        quantity = parse_quantity(raw)
    except QuantityError as error:
        raise QuantityError(f"{what}: {error}; write a whole number of {unit_word}") from None
    text = quantity.text
    if byte_unit is not None and quantity.has_byte_suffix:
        # "4Gi" on a GiB cluster is 4 * 2**30 units of GiB each, not 4 GiB.
        bytes_asked = quantity.value
        per_unit = MIB_PER_UNIT[byte_unit] * BYTES_PER_MIB
        suggestion = -(-bytes_asked // per_unit)  # round up to whole units
        raise QuantityError(
            f"{what} is {text!r}, which means {format_units(quantity.value)} {unit_word}: "
            f"the resource counts whole {unit_word}, not bytes; write "
            f"{format_units(max(suggestion, 1))!r} instead",
            reason=Reason.UNIT_CONFUSION,
        )
    value = quantity.value
    if value <= 0:
        raise QuantityError(
            f"{what} is {text!r}; it must be a positive whole number of {unit_word} (1 or more)",
            reason=Reason.NON_POSITIVE,
        )
    if value.denominator != 1:
        rounded = -(-value.numerator // value.denominator)
        raise QuantityError(
            f"{what} is {text!r} ({format_units(value)} {unit_word}), which is not a whole "
            f"number; GPU resources are counted in whole {unit_word}: write {str(rounded)!r}",
            reason=Reason.FRACTIONAL,
        )
    count = value.numerator
    if maximum is not None and count > maximum:
        raise QuantityError(
            f"{what} is {text!r}; it must be at most {maximum} {unit_word}",
            reason=Reason.OUT_OF_RANGE,
        )
    return count


def limit_text(mib: int) -> str:
    """A memory limit in the shim's syntax, ``<MiB>m``: the only form the webhook writes."""
    return f"{mib}m"


def limit_mib(text: object) -> int | None:
    """The MiB of a limit written by :func:`limit_text`; None for any other text."""
    if not isinstance(text, str) or not text.endswith("m") or not text[:-1].isdigit():
        return None
    return int(text[:-1])


def go_value(raw: object) -> int:
    """A quantity as Go's ``Quantity.Value()`` reads it (rounded up); 0 if missing or malformed.

    The schedulers read a node's capacity and a pod's limits this way, so
    the webhook reads them alike wherever it counts what they count.
    """
    if raw is None:
        return 0
    try:
        return math.ceil(parse_quantity(raw).value)
    except QuantityError:
        return 0
