"""The quantity grammar and the whole-number rule, table-driven."""

from __future__ import annotations

from fractions import Fraction

import pytest

from webhook.decision.quantities import (
    BYTES_PER_MIB,
    MIB_PER_UNIT,
    Quantity,
    go_value,
    limit_mib,
    limit_text,
    parse_quantity,
    plain_count,
    whole_count,
)
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


# What a quantity the grammar refuses is told, exactly: the text (cut short
# when long), and why.
REFUSED = [
    (True, 'True is not a quantity (use a string such as "4")'),
    (None, 'None is not a quantity (use a string such as "4")'),
    ([4], '[4] is not a quantity (use a string such as "4")'),
    (float("nan"), "nan is not a quantity"),
    (float("-inf"), "-inf is not a quantity"),
    ("4 Gi", "'4 Gi' is not a Kubernetes quantity"),
    ("1" * 65, "'11111111111111111111'... is not a quantity (too long)"),
    ("1e31", "'1e31' is out of range"),
    ("1e-31", "'1e-31' is out of range"),
]


@pytest.mark.parametrize(("raw", "message"), REFUSED, ids=[str(r[0])[:12] for r in REFUSED])
def test_what_the_grammar_refuses_is_told_why(raw: object, message: str) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(raw)
    assert str(caught.value) == message


# Each limit of the grammar, at its edge: the longest text, the largest
# exponent, the longest plain count (past it, the full grammar reads it).
EDGES = [
    ("1" * 64, Fraction(int("1" * 64)), ""),
    ("1e30", Fraction(10**30), "e"),
    ("1e-30", Fraction(1, 10**30), "e"),
    ("9" * 18, Fraction(int("9" * 18)), ""),
    ("9" * 19, Fraction(int("9" * 19)), ""),
    (1.5, Fraction(3, 2), ""),
    ("1E", Fraction(10**18), "E"),
    ("1P", Fraction(10**15), "P"),
    ("1T", Fraction(10**12), "T"),
    ("1G", Fraction(10**9), "G"),
    ("1M", Fraction(10**6), "M"),
    ("1u", Fraction(1, 10**6), "u"),
    ("1Mi", Fraction(2**20), "Mi"),
    ("1Ti", Fraction(2**40), "Ti"),
    ("1Pi", Fraction(2**50), "Pi"),
    ("1Ei", Fraction(2**60), "Ei"),
]


@pytest.mark.parametrize(("raw", "value", "suffix"), EDGES, ids=[str(e[0])[:12] for e in EDGES])
def test_the_grammar_at_its_edges(raw: object, value: Fraction, suffix: str) -> None:
    quantity = parse_quantity(raw)
    assert (quantity.value, quantity.suffix) == (value, suffix)


@pytest.mark.parametrize(
    ("suffix", "scales"),
    [("", False), ("n", False), ("u", False), ("m", False), ("e", False)]
    + [(s, True) for s in ("k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")],
)
def test_byte_suffixes_are_the_ones_that_scale_by_a_thousand_or_more(
    suffix: str, scales: bool
) -> None:
    # What "4Gi where GiB are counted" is caught by: every scaling suffix, no other.
    assert Quantity("1" + suffix, Fraction(1), suffix).has_byte_suffix is scales


@pytest.mark.parametrize(
    ("raw", "maximum", "count"),
    [
        ("1", None, 1),
        ("4", None, 4),
        ("100", 100, 100),
        ("101", 100, None),
        ("0", None, None),
        ("01", None, 1),
        ("4.0", None, None),
        ("+4", None, None),
        (4, None, None),
        ("٤", None, None),
        ("9" * 18, None, int("9" * 18)),
        ("9" * 19, None, None),
    ],
)
def test_the_plain_count_shortcut_takes_plain_counts_only(
    raw: object, maximum: int | None, count: int | None
) -> None:
    # Nearly every GPU quantity is a short string of digits: those skip the
    # grammar; anything else, even a count it would accept, goes through it.
    assert plain_count(raw, maximum) == count


def test_whole_count_names_the_place_and_the_unit() -> None:
    with pytest.raises(QuantityError) as caught:
        whole_count("x", what="container 'a' limit r", unit_word="GPUs")
    assert str(caught.value) == (
        "container 'a' limit r: 'x' is not a Kubernetes quantity; write a whole number of GPUs"
    )


@pytest.mark.parametrize(
    ("text", "mib"),
    [("4096m", 4096), ("0m", 0), ("4096", None), ("m", None), ("4Gm", None), ("-1m", None),
     (4096, None), (None, None), ("4096M", None)],
)  # fmt: skip
def test_the_limit_text_is_written_once_and_read_back(text: object, mib: int | None) -> None:
    assert limit_mib(text) == mib
    if mib is not None:
        assert limit_text(mib) == text


@pytest.mark.parametrize(
    ("raw", "value"),
    [("16", 16), ("1500m", 2), ("1k", 1000), ("1Ki", 1024), ("0", 0),
     ("lots", 0), (None, 0), (8, 8)],
)  # fmt: skip
def test_a_quantity_reads_as_gos_value_rounded_up(raw: object, value: int) -> None:
    assert go_value(raw) == value


def test_mib_per_unit() -> None:
    assert (MIB_PER_UNIT["GiB"], MIB_PER_UNIT["MiB"], BYTES_PER_MIB) == (1024, 1, 2**20)
