"""The pure parts of the parameter-server transport: headers, dtype codes, payload readers,
staleness stats, and the ps-side optimizers against NumPy reference formulas (Keras's)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.distribute.ps import protocol as P
from hpcdist.distribute.ps.optimizer_host import OptimizerHost
from hpcdist.distribute.ps.protocol import PSError, PSTypeError
from hpcdist.distribute.ps.server import StalenessStats
from hpcdist.optimizers import SGD, Adam, AdamW, RMSprop

# -- header and wire helpers ------------------------------------------------------------------


@settings(deadline=None, max_examples=60)
@given(
    op=st.sampled_from(sorted(P.OP_NAMES)),
    var_id=st.integers(0, 2**40),
    count=st.integers(0, 10**6),
    shape=st.lists(st.integers(0, 5), max_size=8),
    dtype=st.sampled_from(P.SUPPORTED_DTYPES),
    words=st.lists(st.integers(-(2**62), 2**62), min_size=4, max_size=4),
)
def test_header_round_trip(op, var_id, count, shape, dtype, words):
    value = np.zeros(shape, dtype)
    h = P.encode_header(op, var_id, count, value, *words)
    assert h.dtype == np.int64 and h.shape == (P.HEADER_WORDS,)
    d = P.decode_header(h)
    assert d["op"] == P.OP_NAMES[op]
    assert (d["id"], d["count"], d["nbytes"], d["dtype"]) == (var_id, count, value.nbytes, dtype)
    assert d["shape"] == (tuple(shape) if len(shape) <= P.MAX_NDIM else None)
    assert [d["a"], d["b"], d["c"], d["d"]] == words


def test_header_reuses_out_and_clears_old_words():
    out = np.full(P.HEADER_WORDS, 99, np.int64)
    h = P.encode_header(P.OP_STATS, out=out)
    assert h is out
    assert h[P.OP] == P.OP_STATS and h[P.M.MAGIC_WORD] == P.M.MAGIC
    ps_words = np.delete(h, [P.M.MAGIC_WORD, P.M.VERSION_WORD, P.OP])
    assert not ps_words.any()


def test_dtype_codes_are_a_bijection_and_unsupported_dtypes_are_type_errors():
    codes = [P.dtype_code(d) for d in P.SUPPORTED_DTYPES]
    assert len(set(codes)) == len(codes) == 6
    assert [P.dtype_of(c) for c in codes] == list(P.SUPPORTED_DTYPES)
    for bad in (np.complex64, np.int8, np.uint16, object):
        with pytest.raises(TypeError, match="supported dtypes are"):
            P.dtype_code(bad)
    with pytest.raises(PSError, match="unknown dtype code 99"):
        P.dtype_of(99)


@pytest.mark.parametrize("x", [0.0, -0.0, 1e-300, 0.1, -3.5, math.inf, 1e308])
def test_float_words_are_exact(x):
    assert P.word_float(P.float_word(x)) == x
    assert math.isnan(P.word_float(P.float_word(math.nan)))


def test_number_of_payloads_per_operation():
    n = P.num_payloads
    assert n(P.encode_header(P.OP_CREATE)) == 2
    assert n(P.encode_header(P.OP_DECLARE)) == 1
    assert n(P.encode_header(P.OP_PULL, count=1)) == 0
    assert n(P.encode_header(P.OP_PULL, count=5)) == 1
    assert n(P.encode_header(P.OP_APPLY, count=5)) == 6
    assert n(P.encode_header(P.OP_APPLY_SPARSE)) == 2
    assert n(P.encode_header(P.OP_DONE)) == n(P.encode_header(P.OP_STATS)) == 0


def test_control_data_round_trips_and_rejects_objects():
    cfg = {"name": "Adam", "learning_rate": {"class_name": "ExponentialDecay", "config": {}}}
    assert P.from_json_bytes(P.to_json_bytes(cfg)) == cfg
    assert P.to_json_bytes(cfg).dtype == np.uint8
    with pytest.raises(TypeError, match="cannot travel"):
        P.to_json_bytes({"f": object()})


def test_as_bytes_is_a_view():
    x = np.arange(3, dtype=np.float32)
    b = P.as_bytes(x)
    b[:4] = np.frombuffer(np.float32(7).tobytes(), np.uint8)
    assert x[0] == 7 and b.nbytes == 12


class _FakeServer:
    """Hands out queued payloads as a server's probe/recv would."""

    def __init__(self, payloads):
        self.payloads = list(payloads)

    def probe_payload(self, src):
        return self.payloads[0].nbytes

    def recv_payload(self, buf, src):
        data = self.payloads.pop(0)
        assert data.nbytes == buf.nbytes
        buf[...] = data


def test_live_reader_peeks_parks_and_drains():
    ids = np.array([4, 5], np.int64).view(np.uint8)
    grad = np.arange(3, dtype=np.float64)
    srv = _FakeServer([ids, grad.view(np.uint8), grad.view(np.uint8)])
    live = P.Live(srv, src=1, total=3)
    assert live.peek_int64().tolist() == [4, 5]
    assert live.peek_int64().tolist() == [4, 5]  # still there
    stored = P.Stored(live.rest())
    assert live.left == 0 and srv.payloads == [] and stored.left == 3
    assert stored.peek_int64().tolist() == [4, 5]
    assert stored.next_bytes().view(np.int64).tolist() == [4, 5]
    out = np.empty(3)
    stored.into(out.view(np.uint8))
    assert out.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(PSError, match="has 24 bytes; the header announced 8"):
        stored.into(np.empty(1).view(np.uint8))
    stored.drain()
    with pytest.raises(PSError, match="more payloads"):
        stored.next_bytes()

    srv = _FakeServer([ids, grad.view(np.uint8)])
    live = P.Live(srv, src=1, total=2)
    live.peek_int64()
    live.drain()
    assert srv.payloads == [] and live.left == 0
    with pytest.raises(PSError, match="more payloads"):
        live.into(np.empty(1).view(np.uint8))


def test_staleness_histogram_counts_overflow_and_clamps_negatives():
    s = StalenessStats(buckets=32)
    values = [0, 0, 3, 31, 32, 100, -2]
    for v in values:
        s.record(v)
    d = s.as_dict()
    hist = [0] * 32
    for v in values:
        hist[min(max(v, 0), 31)] += 1
    assert d["staleness_hist"] == hist and sum(hist) == len(values)
    assert d["staleness_count"] == 7
    assert d["staleness_sum"] == sum(max(v, 0) for v in values) == 166
    assert d["staleness_max"] == 100


# -- the ps-side optimizers against NumPy references ------------------------------------------


def ref_step(kind, opt, p, g, s, t, lr):
    """One Keras-formula step in float64 (``t`` = updates before this one)."""
    wd = opt.weight_decay or 0.0
    p = p - lr * wd * p
    if kind == "sgd":
        if opt.momentum > 0:
            s["m"] = opt.momentum * s["m"] - lr * g
            return p + (opt.momentum * s["m"] - lr * g if opt.nesterov else s["m"])
        return p - lr * g
    if kind in ("adam", "adamw"):
        b1, b2 = opt.beta_1, opt.beta_2
        s["m"] = s["m"] + (g - s["m"]) * (1 - b1)
        s["v"] = s["v"] + (g * g - s["v"]) * (1 - b2)
        lr_t = lr * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
        return p - lr_t * s["m"] / (np.sqrt(s["v"]) + opt.epsilon)
    s["v"] = opt.rho * s["v"] + (1 - opt.rho) * g * g
    denom = s["v"] + opt.epsilon
    if opt.centered:
        s["a"] = opt.rho * s["a"] + (1 - opt.rho) * g
        denom = s["v"] - s["a"] ** 2 + opt.epsilon
    inc = lr * g / np.sqrt(denom)
    if opt.momentum > 0:
        s["m"] = opt.momentum * s["m"] + inc
        return p - s["m"]
    return p - inc


CASES = [
    ("sgd", SGD(0.1)),
    ("sgd", SGD(0.1, momentum=0.9)),
    ("sgd", SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adam", Adam(0.01)),
    ("adamw", AdamW(0.01, weight_decay=0.05)),
    ("rmsprop", RMSprop(0.01, rho=0.8, momentum=0.5, centered=True)),
    ("rmsprop", RMSprop(0.01)),
]


@pytest.mark.parametrize("kind,opt", CASES, ids=[f"{k}{i}" for i, (k, _) in enumerate(CASES)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_dense_apply_matches_the_reference(kind, opt, dtype):
    host = OptimizerHost()
    host.register(3, type(opt).__name__, opt.get_config())
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal((4, 3))
    p = p0.astype(dtype)
    ref = p0.copy()
    state = {k: np.zeros_like(p0) for k in ("m", "v", "a")}
    for t in range(5):
        g = rng.standard_normal((4, 3))
        lr = 0.05 * (t + 1)  # the lr of each apply is used, not the config's
        host.apply_dense(3, 11, p, g.astype(dtype), lr)
        ref = ref_step(kind, opt, ref, g, state, t, lr)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(p, ref, rtol=tol, atol=tol)
    assert host.step(3, 11) == 5 and host.step(3, 12) == 0
    assert sorted(host.slots(3, 11, p)) == sorted(opt.slot_names())


def test_sparse_apply_sums_duplicates_and_touches_only_those_rows():
    opt = Adam(0.01)
    host = OptimizerHost()
    host.register(0, "Adam", opt.get_config())
    table = np.arange(12, dtype=np.float64).reshape(6, 2)
    before = table.copy()
    rows = np.array([4, 1, 4, 4])
    vals = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]])
    host.apply_sparse(0, 9, table, rows, vals, lr=0.1)
    host.apply_sparse(0, 9, table, np.array([1]), np.array([[1.0, 1.0]]), lr=0.1)
    # Reference: row 4 gets one Adam step with the summed gradient; row 1 two steps (t = 0, 1).
    s4 = {"m": np.zeros(2), "v": np.zeros(2)}
    r4 = ref_step("adam", opt, before[4], vals[[0, 2, 3]].sum(0), s4, 0, 0.1)
    s1 = {"m": np.zeros(2), "v": np.zeros(2)}
    r1 = ref_step("adam", opt, before[1], vals[1], s1, 0, 0.1)
    r1 = ref_step("adam", opt, r1, np.array([1.0, 1.0]), s1, 1, 0.1)
    np.testing.assert_allclose(table[4], r4, rtol=1e-12)
    np.testing.assert_allclose(table[1], r1, rtol=1e-12)
    untouched = [0, 2, 3, 5]
    np.testing.assert_array_equal(table[untouched], before[untouched])
    m = host.slots(0, 9, table)["m"].reshape(6, 2)
    np.testing.assert_array_equal(m[untouched], 0.0)
    np.testing.assert_allclose(m[1], s1["m"], rtol=1e-12)
    assert host.step(0, 9) == 2


def test_sparse_apply_errors():
    host = OptimizerHost()
    host.register(0, "SGD", SGD(0.1).get_config())
    table = np.zeros((3, 2))
    with pytest.raises(PSError, match=r"outside \[0, 3\)"):
        host.apply_sparse(0, 1, table, np.array([0, 3]), np.zeros((2, 2)), 0.1)
    with pytest.raises(PSError, match="need 4 values, got 3"):
        host.apply_sparse(0, 1, table, np.array([0, 1]), np.zeros(3), 0.1)
    with pytest.raises(PSError, match="scalar"):
        host.apply_sparse(0, 1, np.zeros(()), np.array([0]), np.zeros(1), 0.1)


def test_clipping_on_the_ps():
    host = OptimizerHost()
    host.register(0, "SGD", SGD(1.0, clipnorm=1.0).get_config())
    host.register(1, "SGD", SGD(1.0, clipvalue=0.5).get_config())
    p = np.zeros(2)
    host.apply_dense(0, 0, p, np.array([3.0, 4.0]), lr=1.0)
    np.testing.assert_allclose(p, [-0.6, -0.8])
    q = np.zeros(2)
    host.apply_dense(1, 0, q, np.array([3.0, -0.25]), lr=1.0)
    np.testing.assert_allclose(q, [-0.5, 0.25])


def test_register_is_idempotent_ignores_lr_and_rejects_conflicts():
    host = OptimizerHost()
    host.register(0, "Adam", Adam(0.1).get_config())
    host.register(0, "Adam", Adam(0.5).get_config())  # lr differs: same optimizer
    with pytest.raises(PSError, match="already registered"):
        host.register(0, "Adam", Adam(0.1, beta_1=0.8).get_config())
    with pytest.raises(PSError, match="already registered"):
        host.register(0, "SGD", SGD(0.1).get_config())
    with pytest.raises(PSError, match="cannot run optimizer class 'Adagrad'"):
        host.register(1, "Adagrad", {})
    with pytest.raises(PSError, match="cannot build optimizer"):
        host.register(2, "SGD", {"momentum": 7.0})
    with pytest.raises(PSError, match="no optimizer is registered with id 5"):
        host.apply_dense(5, 0, np.zeros(2), np.zeros(2), 0.1)


def test_optimizer_refuses_non_float_variables_and_bad_sizes():
    host = OptimizerHost()
    host.register(0, "SGD", SGD(0.1).get_config())
    with pytest.raises(PSTypeError, match="float32 and float64"):
        host.apply_dense(0, 0, np.zeros(2, np.int64), np.zeros(2), 0.1, name="step")
    with pytest.raises(PSError, match="3 elements but the variable has shape"):
        host.apply_dense(0, 0, np.zeros(2), np.zeros(3), 0.1)


def test_forget_drops_slots():
    host = OptimizerHost()
    host.register(0, "SGD", SGD(0.1, momentum=0.9).get_config())
    p = np.zeros(2)
    host.apply_dense(0, 4, p, np.ones(2), 0.1)
    assert host.step(0, 4) == 1 and host.slots(0, 4, p)["momentum"].any()
    host.forget(4)
    assert host.step(0, 4) == 0 and not host.slots(0, 4, p)["momentum"].any()


def test_serve_checks_its_clients():
    from hpcdist.distribute.ps.server import serve
    from hpcdist.runtime import mpi

    comm = mpi().COMM_SELF
    with pytest.raises(ValueError, match="distinct ranks"):
        serve(comm, [0])  # the server itself
    with pytest.raises(ValueError, match="distinct ranks"):
        serve(comm, [])
