"""The quantity grammar and the whole-number rule, table-driven."""

from __future__ import annotations

from fractions import Fraction

import pytest

from webhook.decision.quantities import parse_quantity, whole_count
from webhook.errors import QuantityError

PARSES = [
    ("4", Fraction(4), ""),
    (4, Fraction(4), ""),
    ("+4", Fraction(4), ""),
    ("4.", Fraction(4), ""),
    (".5", Fraction(1, 2), ""),
    ("500m", Fraction(1, 2), "m"),
    ("1k", Fraction(1000), "k"),
    ("4Gi", Fraction(4 * 2**30), "Gi"),
    ("1Ki", Fraction(1024), "Ki"),
    ("2e3", Fraction(2000), "e"),
    ("2E-1", Fraction(1, 5), "e"),
    ("-1", Fraction(-1), ""),
    ("10n", Fraction(1, 10**8), "n"),
]


@pytest.mark.parametrize(("raw", "value", "suffix"), PARSES, ids=[str(p[0]) for p in PARSES])
def test_parse(raw: object, value: Fraction, suffix: str) -> None:
    quantity = parse_quantity(raw)
    assert (quantity.value, quantity.suffix) == (value, suffix)


BAD = [
    "",
    "four",
    "4 Gi",
    "4gi",
    "Gi",
    "1.2.3",
    "0x10",
    "1e",
    "1e999",
    "--1",
    "4GiB",
    "∞",
    "x" * 70,
]


@pytest.mark.parametrize("raw", BAD)
def test_parse_rejects(raw: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(raw)


@pytest.mark.parametrize("raw", [True, None, [4], {"a": 1}, float("nan"), float("inf")])
def test_parse_rejects_non_quantities(raw: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(raw)


WHOLE = [
    ("0.5", "fractional", "write '1'"),
    ("500m", "fractional", "write '1'"),
    ("1.5", "fractional", "write '2'"),
    ("0", "non-positive", "1 or more"),
    ("-3", "non-positive", "1 or more"),
    ("4Gi", "unit-confusion", "4294967296 GiB"),
    ("4Gi", "unit-confusion", "write '4'"),
    ("512Mi", "unit-confusion", "write '1'"),
    ("2G", "unit-confusion", "write '2'"),
    ("4e", "bad-quantity", "not a Kubernetes quantity"),
]


@pytest.mark.parametrize(("raw", "reason", "phrase"), WHOLE, ids=[f"{w[0]}-{w[2]}" for w in WHOLE])
def test_whole_count_explains(raw: str, reason: str, phrase: str) -> None:
    with pytest.raises(QuantityError) as caught:
        whole_count(
            raw, what="container 'x' limit aliyun.com/gpu-mem", unit_word="GiB", byte_unit="GiB"
        )
    assert caught.value.reason == reason
    assert phrase in str(caught.value)
    assert "container 'x'" in str(caught.value)


def test_whole_count_mib_suggestion() -> None:
    with pytest.raises(QuantityError, match="write '4096'"):
        whole_count("4Gi", what="w", unit_word="MiB", byte_unit="MiB")


@pytest.mark.parametrize(
    ("raw", "expected"), [("4", 4), (4, 4), ("4.0", 4), ("1e1", 10), ("+2", 2)]
)
def test_whole_count_accepts(raw: object, expected: int) -> None:
    assert whole_count(raw, what="w", unit_word="GiB", byte_unit="GiB") == expected


def test_whole_count_maximum() -> None:
    assert whole_count("100", what="w", unit_word="percent", maximum=100) == 100
    with pytest.raises(QuantityError, match="at most 100"):
        whole_count("101", what="w", unit_word="percent", maximum=100)
