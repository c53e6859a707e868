"""hpcdist.runtime.messages: headers, value round trips, every malformed case, and fuzzing."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcdist.errors import (
    HpcdistError,
    MessageEncodeError,
    MessageError,
    MessageHeaderError,
    MessageSizeError,
    MessageTruncatedError,
    MessageVersionError,
    UnknownMessageTypeError,
)
from hpcdist.runtime import messages as M

pytestmark = pytest.mark.timeout(300)  # a decode that hangs fails instead of stalling the run


def same(a, b) -> bool:
    """Equal in value AND type, recursively (arrays: dtype, shape and bytes)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def roundtrip(value, **kw):
    return M.decode_value(M.encode_value(value), **kw)


# -- headers -------------------------------------------------------------------------------------
def test_header_round_trip_keeps_every_field():
    h = M.new_header(9, length=123, request=77, flags=1, args=range(M.ARG_WORDS))
    assert h.dtype == np.int64 and h.shape == (M.HEADER_WORDS,)
    head = M.check_header(h, types={9}, flags=1)
    assert (head.type, head.length, head.request, head.flags) == (9, 123, 77, 1)
    assert head.args == tuple(range(M.ARG_WORDS))


def test_new_header_reuses_out_and_clears_it():
    out = np.full(M.HEADER_WORDS, 5, np.int64)
    h = M.new_header(3, out=out)
    assert h is out and M.check_header(h).args == (0,) * M.ARG_WORDS


def test_new_header_refuses_too_many_words():
    with pytest.raises(MessageEncodeError, match="16 protocol words; got 17"):
        M.new_header(1, args=[0] * (M.ARG_WORDS + 1))


def _bad(word: int, value: int) -> np.ndarray:
    h = M.new_header(1, length=8)
    h[word] = value
    return h


@pytest.mark.parametrize(
    ("header", "error", "text"),
    [
        (_bad(M.MAGIC_WORD, 12345), MessageHeaderError, "magic word"),
        (_bad(M.VERSION_WORD, 2), MessageVersionError, "version 2"),
        (_bad(M.TYPE, 99), UnknownMessageTypeError, "type 99; expected one of"),
        (_bad(M.FLAGS, 4), MessageHeaderError, "flag bits"),
        (_bad(M.LENGTH, -1), MessageHeaderError, "-1 payload bytes"),
        (_bad(M.LENGTH, 1 << 40), MessageSizeError, "the limit is"),
        (_bad(6, 1), MessageHeaderError, "reserved"),
        (np.zeros(M.HEADER_WORDS - 1, np.int64), MessageHeaderError, "shape"),
        (np.zeros(M.HEADER_WORDS, np.int32), MessageHeaderError, "dtype int32"),
    ],
)
def test_each_malformed_header_raises_its_typed_error(header, error, text):
    with pytest.raises(error, match=text) as info:
        M.check_header(header, types={1})
    assert isinstance(info.value, MessageError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, HpcdistError)


def test_size_limit_comes_from_the_argument_or_the_environment(monkeypatch):
    h = M.new_header(1, length=1000)
    with pytest.raises(MessageSizeError, match="announces 1000 payload bytes; the limit is 999"):
        M.check_header(h, limit=999)
    monkeypatch.setenv("HPCDIST_MAX_MESSAGE_BYTES", "500")
    assert M.max_message_bytes() == 500
    with pytest.raises(MessageSizeError, match="HPCDIST_MAX_MESSAGE_BYTES"):
        M.check_header(h)
    monkeypatch.setenv("HPCDIST_MAX_MESSAGE_BYTES", "lots")
    with pytest.raises(MessageSizeError, match="'lots'; expected a positive integer"):
        M.max_message_bytes()


def test_payload_larger_than_announced_is_refused():
    M.check_payload(8, 8)
    with pytest.raises(
        MessageSizeError, match="payload of 9 bytes but its header announced only 8"
    ):
        M.check_payload(9, 8)


# -- values: every type --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -(2**63),
        2**63 - 1,
        2**200,
        -(2**90),
        1.5,
        float("inf"),
        float("nan"),
        3 - 4j,
        "",
        "text with ünïcode \u2603",
        b"",
        b"\x00\xff raw",
        [],
        (),
        {},
        [1, (2, "x"), {"k": [None]}],
        {1: "int key", ("a", 1): "tuple key", "s": {"nested": {"deeper": [1.0]}}},
    ],
)
def test_python_values_round_trip_with_their_types(value):
    assert same(roundtrip(value), value)


@pytest.mark.parametrize(
    "dtype",
    ["float16", "float32", "float64", "int8", "int32", "int64", "uint16", "bool", "complex64",
     ">f8", "<U5", "S3", "datetime64[s]", "timedelta64[ms]"],
)  # fmt: skip
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), (4, 0, 2)])
def test_arrays_keep_dtype_shape_and_bytes(dtype, shape):
    raw = np.random.default_rng(0).integers(0, 100, size=shape)
    x = raw.astype(dtype) if np.dtype(dtype).kind not in "US" else raw.astype(str).astype(dtype)
    out = roundtrip(x)
    assert out.dtype == np.dtype(dtype) and out.shape == shape
    assert out.tobytes() == x.tobytes() and out.flags.writeable


def test_numpy_scalars_and_non_contiguous_views():
    for s in (np.float32(1.5), np.int64(-3), np.bool_(True), np.complex128(1j), np.str_("u")):
        got = roundtrip(s)
        assert type(got) is type(s) and got == s
    view = np.arange(24.0).reshape(4, 6)[::2, 1::3]
    np.testing.assert_array_equal(roundtrip(view), view)


def test_array_data_is_aligned_and_views_need_no_copy():
    buf = M.encode_value({"pad": "xyz", "a": np.arange(5, dtype=np.float64)})
    out = M.decode_value(buf, copy=False)
    assert out["a"].ctypes.data % 8 == 0
    assert np.shares_memory(out["a"], buf)
    assert not np.shares_memory(M.decode_value(buf)["a"], buf)


def test_bytes_and_uint8_arrays_decode_alike():
    buf = M.encode_value([1, "a"])
    assert M.decode_value(buf) == M.decode_value(buf.tobytes()) == [1, "a"]


def test_extensions_carry_protocol_types():
    class Box:
        def __init__(self, v):
            self.v = v

    def extend(x):
        return ("box", x.v) if isinstance(x, Box) else None

    buf = M.encode_value([Box({"a": 1})], extend=extend)
    out = M.decode_value(buf, extensions={"box": Box})
    assert isinstance(out[0], Box) and out[0].v == {"a": 1}
    with pytest.raises(UnknownMessageTypeError, match="extension 'box'"):
        M.decode_value(buf)
    with pytest.raises(MessageError, match="'box' extension is malformed"):
        M.decode_value(buf, extensions={"box": lambda v: v["missing"]})


def test_substitute_extension_encodes_in_place():
    buf = M.encode_value({"x": 1}, extend=lambda x: ("", [x["x"]]) if isinstance(x, dict) else None)
    assert M.decode_value(buf) == [1]


# -- values: refused on encode ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "text"),
    [
        (object(), "the value is a builtins.object"),
        ({"a": [1, {2}]}, "the value['a'][1] is a builtins.set"),
        (np.array([object()]), "dtype object"),
        (np.zeros(2, dtype=[("a", "i4")]), "without pickle"),
    ],
)
def test_values_that_cannot_travel_raise_encode_error_naming_the_part(value, text):
    with pytest.raises(MessageEncodeError, match="cannot travel") as info:
        M.encode_value(value)
    assert text in str(info.value) and isinstance(info.value, TypeError)


def test_cycles_and_deep_nests_are_refused():
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(MessageEncodeError, match="contains itself"):
        M.encode_value(loop)
    deep: list = []
    for _ in range(M.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(MessageEncodeError, match="nested deeper"):
        M.encode_value(deep)


def test_encoding_past_the_limit_raises_size_error():
    with pytest.raises(MessageSizeError, match="past the limit of 100 bytes"):
        M.encode_value(np.zeros(100), limit=100)


# -- values: every malformed case on decode --------------------------------------------------------
GOOD = M.encode_value({"a": np.arange(3, dtype=np.int32), "s": "text", "l": [1, 2.5]})


def _with(prefix: bytes) -> bytes:
    return M.VALUE_MAGIC + prefix


@pytest.mark.parametrize(
    ("data", "error", "text"),
    [
        (b"", MessageError, "not an hpcdist message value"),
        (b"JSON{}", MessageError, "not an hpcdist message value"),
        (b"HMV\x02N", MessageError, "not an hpcdist message value"),  # another value version
        (_with(b""), MessageTruncatedError, "a value tag"),
        (_with(b"i\x01\x02"), MessageTruncatedError, "an int"),
        (_with(b"s" + struct.pack("<Q", 10) + b"abc"), MessageTruncatedError, "10 string bytes"),
        (_with(b"s" + struct.pack("<Q", 2) + b"\xff\xfe"), MessageError, "not valid UTF-8"),
        (_with(b"l" + struct.pack("<Q", 2**62)), MessageTruncatedError, "items"),
        (_with(b"d" + struct.pack("<Q", 1) + b"l" + struct.pack("<Q", 0) + b"N"), MessageError,
         "not hashable"),
        (_with(b"?"), MessageError, "unknown tag"),
        (_with(b"NN"), MessageError, "1 bytes after its end"),
        (_with(b"a\x03|O8\x00"), MessageError, "dtype code"),
        (_with(b"a\x04<f8X\x00"), MessageError, "dtype code"),
        (GOOD[:-1].tobytes(), MessageTruncatedError, "truncated"),
        (_with(b"l" + struct.pack("<Q", 1) + b"l" + struct.pack("<Q", 1)), MessageTruncatedError,
         "1 items but only 0 bytes remain"),
    ],
)  # fmt: skip
def test_each_malformed_value_raises_its_typed_error(data, error, text):
    with pytest.raises(error, match=text):
        M.decode_value(data)


def test_array_whose_size_does_not_match_its_shape_is_refused():
    buf = bytearray(M.encode_value(np.zeros(2, np.float64)).tobytes())
    at = buf.index(struct.pack("<Q", 16))  # the nbytes word
    buf[at : at + 8] = struct.pack("<Q", 8)
    with pytest.raises(MessageError, match=r"shape \(2,\) carries 8 bytes; expected 16"):
        M.decode_value(bytes(buf))


def test_huge_shape_is_refused_without_allocating():
    buf = bytearray(M.encode_value(np.zeros((1, 1), np.float64)).tobytes())
    dims = struct.pack("<Q", 1) * 2
    at = buf.index(dims)
    buf[at : at + 16] = struct.pack("<Q", 2**40) * 2
    with pytest.raises(MessageError):
        M.decode_value(bytes(buf))


def test_empty_array_with_an_absurd_shape_is_refused():
    buf = bytearray(M.encode_value(np.zeros((0, 1), np.int64)).tobytes())
    at = buf.index(struct.pack("<Q", 0) + struct.pack("<Q", 1))
    buf[at + 8 : at + 16] = struct.pack("<Q", 2**63 - 1)
    with pytest.raises(MessageError, match="too large for any array"):
        M.decode_value(bytes(buf))
    rank = bytearray(M.encode_value(np.zeros(1)).tobytes())
    rank[rank.index(b"<f8") + 3] = 40
    with pytest.raises(MessageError, match="40 dimensions; at most 32"):
        M.decode_value(bytes(rank))


def test_deep_nesting_on_the_wire_is_refused():
    data = _with(b"l" + struct.pack("<Q", 1)) + (b"l" + struct.pack("<Q", 1)) * 200 + b"N"
    with pytest.raises(MessageError, match="nested deeper"):
        M.decode_value(data)


def test_non_uint8_buffers_are_refused():
    with pytest.raises(MessageError, match="1-d uint8"):
        M.decode_value(np.zeros(3, np.int64))
    with pytest.raises(MessageError, match="must be bytes or a uint8 array; got int"):
        M.decode_value(10**12)  # never bytes(10**12)


# -- fuzzing ---------------------------------------------------------------------------------------
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.complex_numbers(allow_nan=False),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.lists(st.floats(width=32), max_size=5).map(lambda v: np.asarray(v, np.float32)),
    st.lists(st.integers(-9, 9), max_size=6).map(lambda v: np.asarray(v, np.int64).reshape(-1, 1)),
    st.integers(-5, 5).map(np.int16),
)
nests = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers()), kids, max_size=3),
    ),
    max_leaves=15,
)


@settings(max_examples=150, deadline=None)
@given(nests)
def test_fuzz_any_nest_round_trips(value):
    assert same(roundtrip(value), value)


def _decode_only_typed_errors(data: bytes) -> None:
    """Decoding ``data`` returns or raises MessageError; nothing else, and little memory."""
    tracemalloc.start()
    try:
        M.decode_value(data)
    except MessageError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    # every allocation is bounded by the buffer (Python objects cost ~100x a tag byte)
    assert peak < 200 * len(data) + 64_000


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_raise_only_message_errors(data):
    _decode_only_typed_errors(data)
    _decode_only_typed_errors(M.VALUE_MAGIC + data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nests, st.data())
def test_fuzz_mutated_valid_values_raise_only_message_errors(value, data):
    buf = bytearray(M.encode_value(value).tobytes())
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "word"]))
        at = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "flip" and buf:
            buf[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del buf[at:]
        elif kind == "insert":
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif len(buf) >= at + 8:  # a huge length or count word
            buf[at : at + 8] = struct.pack(
                "<Q", data.draw(st.sampled_from([2**63 - 1, 2**40, 255]))
            )
    _decode_only_typed_errors(bytes(buf))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=M.HEADER_WORDS,
                max_size=M.HEADER_WORDS), st.booleans())  # fmt: skip
def test_fuzz_random_headers_raise_only_message_errors(words, keep_magic):
    h = np.array(words, np.int64)
    if keep_magic:
        h[M.MAGIC_WORD], h[M.VERSION_WORD] = M.MAGIC, M.VERSION
    try:
        head = M.check_header(h, types={1, 2, 3})
    except MessageError:
        return
    assert head.type in {1, 2, 3} and 0 <= head.length <= M.max_message_bytes()
