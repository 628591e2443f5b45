"""The encoders write what the standard encoder writes; an op's value goes out as it came."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest

from webhook.decision import jsontext, patch, responses

VALUES: list[Any] = [
    "plain",
    'quote " backslash \\ newline \n tab \t',
    "lone surrogate \ud800 and é and 雪",
    "",
    0,
    -7,
    2**70,
    1.5,
    1e300,
    True,
    False,
    None,
    [],
    {},
    [1, "two", None, [3.0]],
    {"b": 1, "a": {"z": [True, {"é": "\u2028"}], "y": None}},
    {"gpushare-webhook.io/status": '{"demand":"4GiB"}', "decision": "mutated"},
    {"name": "gpushare-shim", "hostPath": {"path": "/usr/local/vgpu", "type": "Directory"}},
]

OPTIONS: list[dict[str, Any]] = [
    {},
    {"sort_keys": True},
    {"ascii_only": False, "separators": (", ", ": ")},
]


def _stdlib(options: dict[str, Any]) -> Any:
    return json.JSONEncoder(
        ensure_ascii=options.get("ascii_only", True),
        sort_keys=options.get("sort_keys", False),
        separators=options.get("separators", (",", ":")),
        check_circular=False,
        default=options.get("default"),
    ).encode


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_each_encoder_writes_what_the_standard_encoder_writes(
    options: dict[str, Any], value: Any
) -> None:
    assert jsontext.encoder(**options)(value) == _stdlib(options)(value)


def test_the_shared_encoders_are_compact_ascii_and_sorted_compact_ascii() -> None:
    value = VALUES[-3]
    assert jsontext.compact(value) == _stdlib({})(value)
    assert jsontext.sorted_compact(value) == _stdlib({"sort_keys": True})(value)


def test_a_value_json_has_no_form_for_goes_through_default_or_is_refused() -> None:
    when = dt.datetime(2026, 12, 4, tzinfo=dt.UTC)
    assert jsontext.encoder(default=str)({"at": when}) == '{"at":"2026-12-04 00:00:00+00:00"}'
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsontext.compact({"at": when})
    assert jsontext.compact(float("nan")) == json.dumps(float("nan")) == "NaN"


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_an_ops_value_reads_back_from_the_answer_as_it_was(value: Any) -> None:
    path = "/spec/containers/0/env/~1é\u2028"
    for make in (patch.add, patch.replace):
        op = make(path, value)
        assert _patch_of(op) == [op.as_json()]


def _patch_of(op: patch.Op) -> Any:
    review = {"response": {"uid": "u", "allowed": True, "patch": (op,)}}
    answer = json.loads(responses.encode(review))
    return json.loads(base64.b64decode(answer["response"]["patch"]))
