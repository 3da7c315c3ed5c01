"""The request path's JSON: orjson's speed, the standard library's values (pure)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.codec import dumps, loads

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),  # lone surrogates too
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(JSON_VALUES)
def test_what_is_written_reads_back_as_the_standard_library_reads_it(value: Any) -> None:
    raw = dumps(value)
    assert loads(raw) == value
    assert loads(raw.decode("utf-8", "surrogatepass")) == value


@pytest.mark.parametrize(
    "raw",
    [
        '{"big": 123456789012345678901234567890}',  # orjson would read a float
        '{"text": "my card is 1234567890123456789012"}',
        '["\\ud800"]',  # a lone surrogate, escaped
        '{"a": [1, 2.5, "é", null, true]}',
        '{"u64": 18446744073709551615, "past": -18446744073709551616}',
        '{"edge": [1234567890123456789, 123456789012345678]}',  # 19 and 18 digits
        '{"lone": "\ud800 and 123456789012345678901"}',  # str with a lone surrogate
        b'{"bytes": "\xc3\xa9"}',
    ],
)
def test_reads_what_the_standard_library_reads(raw: str | bytes) -> None:
    assert loads(raw) == json.loads(raw)


def test_nan_literals_read_as_the_standard_library_reads_them() -> None:
    assert math.isnan(loads("[NaN]")[0])


def test_bad_json_raises_value_error() -> None:
    with pytest.raises(ValueError):
        loads("{not json")
    with pytest.raises(ValueError):
        loads(b"")
    with pytest.raises(ValueError):  # was RecursionError: a 500 wherever it was read
        loads("[" * 5000 + "]" * 5000)


def test_writes_compact_utf8() -> None:
    assert dumps({"a": "é", "b": [1, 2]}) == '{"a":"é","b":[1,2]}'.encode()
    assert dumps({"n": 2**70}) == b'{"n":1180591620717411303424}'
