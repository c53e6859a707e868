"""The parameter-server transport over real MPI: ``serve`` on ps ranks, ``PSClient`` on the others.

Run under ``mpirun -n 2`` and ``-n 4``. Each test Dups COMM_WORLD; ranks
``0..num_ps-1`` serve, the others are clients (the first one initializes).
Clients check values against NumPy computations; the ps ranks check the
stats ``serve`` returns once every client closed.
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from hpcdist.distribute.ps.client import PSClient
from hpcdist.distribute.ps.protocol import PSError
from hpcdist.distribute.ps.server import serve
from hpcdist.optimizers import SGD, Adam
from hpcdist.runtime import mpi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]

MPI = mpi()


def ps_job(num_ps, body):
    """Run one ps job; returns ``("ps", stats)`` on a ps rank, ``("client", body(...))`` else.

    ``body(client, ctx)`` gets a dict: ``comm`` (clients only: for barriers and
    allgathers), ``index`` (0..clients-1), ``clients`` (their number), ``init``.
    """
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    clients = list(range(num_ps, size))
    sub = comm.Split(0 if rank < num_ps else 1, rank)
    if rank < num_ps:
        out = ("ps", serve(comm, clients))
    else:
        client = PSClient(comm, list(range(num_ps)), initializer=rank == clients[0])
        ctx = {"comm": sub, "index": rank - num_ps, "clients": len(clients), "init": rank == num_ps}
        result = body(client, ctx)
        client.close()
        out = ("client", result)
    sub.Free()
    comm.Free()
    return out


def sync_point(client, ctx, num_ps=1):
    """Every client's earlier requests are done on the ps when this returns on any client."""
    for ps in range(num_ps):
        client.stats(ps)  # a reply comes after every earlier request of this client
    ctx["comm"].Barrier()


def all_ints(ctx, values):
    """Allgather of int64 values over the clients (buffer mode)."""
    mine = np.asarray(values, np.int64)
    out = np.empty(mine.size * ctx["clients"], np.int64)
    ctx["comm"].Allgather(mine, out)
    return out


DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_]


def test_pull_returns_what_the_initializer_created():
    rng = np.random.default_rng(7)
    values = [(rng.standard_normal((3, 2)) * 5).astype(d) for d in DTYPES]
    values += [np.float64(2.5) * np.ones(()), np.zeros((0, 4), np.float32)]

    def body(client, ctx):
        for i, v in enumerate(values):
            # Non-initializers pass other contents of the same shape: the ps keeps the first.
            mine = v if ctx["init"] else np.zeros_like(v)
            client.create(0, i, mine, f"v{i}")
        outs = [np.empty_like(v) for v in values]
        versions = client.pull(0, list(range(len(values))), outs)
        assert versions == [0] * len(values)
        for o, v in zip(outs, values, strict=True):
            np.testing.assert_array_equal(o, v)
            assert o.dtype == v.dtype
        one = np.empty_like(values[2])
        assert client.pull(0, [2], [one]) == [0]
        np.testing.assert_array_equal(one, values[2])
        with pytest.raises(PSError, match="pull of variable 2"):
            client.pull(0, [2], [np.empty((3, 2), np.float32)])  # wrong dtype
        with pytest.raises(PSError, match="shape"):
            client.pull(0, [2], [np.empty((2, 3), np.float64)])  # wrong shape
        return True

    role, res = ps_job(1, body)
    if role == "ps":
        assert res["variables"] == len(values) and res["failed_clients"] == []


def test_exact_counts_under_contention_on_one_or_two_servers():
    n_add, n_fetch = 1000, 200

    def body(client, ctx):
        num_ps = client.num_ps
        for ps in range(num_ps):
            client.create(ps, 10 + ps, np.zeros((), np.int64), f"count{ps}")
            client.create(ps, 20 + ps, np.zeros(3, np.float64), f"vec{ps}")
        client.create(0, 30, np.zeros((), np.int64), "step")
        one = np.ones((), np.int64)
        fetched = []
        for i in range(n_add):
            for ps in range(num_ps):
                client.update(ps, 10 + ps, "add", one)
                client.update(ps, 20 + ps, "sub", np.array([1.0, 2.0, 0.5]))
            if i % (n_add // n_fetch) == 0:
                fetched.append(int(client.add_fetch(0, 30, one)))
        sync_point(client, ctx, num_ps)
        k = ctx["clients"]
        for ps in range(num_ps):
            count, vec = np.empty((), np.int64), np.empty(3)
            versions = client.pull(ps, [10 + ps, 20 + ps], [count, vec])
            assert int(count) == k * n_add
            np.testing.assert_array_equal(vec, -k * n_add * np.array([1.0, 2.0, 0.5]))
            assert versions == [k * n_add, k * n_add]
        # add_fetch is atomic: every client saw different values, together 1..k*n_fetch.
        everyone = np.sort(all_ints(ctx, fetched))
        np.testing.assert_array_equal(everyone, np.arange(1, k * n_fetch + 1))
        assert fetched == sorted(fetched)
        return num_ps

    size = MPI.COMM_WORLD.Get_size()
    num_ps = 2 if size >= 3 else 1
    role, res = ps_job(num_ps, body)
    clients = size - num_ps
    if role == "ps":
        extra = n_fetch * clients if MPI.COMM_WORLD.Get_rank() == 0 else 0
        assert res["updates"] == 2 * n_add * clients + extra
        assert res["applies"] == 0


def test_assign_and_update_errors_come_back_with_the_next_request():
    def body(client, ctx):
        client.create(0, 0, np.zeros((2, 2), np.float32), "w")
        if ctx["init"]:
            client.update(0, 0, "assign", np.full((2, 2), 3.0, np.float32))
            client.update(0, 0, "add", np.ones((2, 2), np.float64))  # cast on the ps
        sync_point(client, ctx)
        out = np.empty((2, 2), np.float32)
        client.pull(0, [0], [out])
        np.testing.assert_array_equal(out, 4.0)
        ctx["comm"].Barrier()
        client.update(0, 0, "add", np.ones(3, np.float32))  # wrong shape: no reply...
        with pytest.raises(PSError, match=r"UPDATE of variable 0: a value of shape \(3,\)"):
            client.pull(0, [0], [out])  # ...so the next request reports it
        client.pull(0, [0], [out])  # reported once
        np.testing.assert_array_equal(out, 4.0)
        with pytest.raises(PSError, match="update op must be one of"):
            client.update(0, 0, "mul", out)
        with pytest.raises(TypeError, match="cannot hold dtype complex128"):
            client.update(0, 0, "add", np.zeros((2, 2), complex))
        with pytest.raises(PSError, match="ps task 3 does not exist"):
            client.stats(3)

    ps_job(1, body)


def test_declare_mismatch_fails_that_client_and_the_server_survives():
    if MPI.COMM_WORLD.Get_size() < 3:
        pytest.skip("needs two clients (mpirun -n 3 or more)")

    def body(client, ctx):
        client.create(0, 0, np.zeros(3, np.float32), "a")
        if ctx["init"]:
            client.create(0, 1, np.zeros(3, np.float32), "b")
        else:
            with pytest.raises(PSError) as err:
                client.create(0, 1, np.zeros(4, np.float64), "b")
            msg = str(err.value)
            assert "shape (4,), dtype float64" in msg  # this client's view
            assert "shape (3,), dtype float32" in msg  # the initializer's
            assert f"client rank {MPI.COMM_WORLD.Get_rank()}" in msg
        out = np.empty(3, np.float32)
        assert client.pull(0, [0], [out]) == [0]
        return True

    role, res = ps_job(1, body)
    if role == "ps":
        assert res["variables"] == 2


def test_requests_wait_for_the_create_and_keep_their_order():
    if MPI.COMM_WORLD.Get_size() < 3:
        pytest.skip("needs two clients (mpirun -n 3 or more)")

    def body(client, ctx):
        out = np.empty(2)
        others = ctx["clients"] - 1
        if ctx["init"]:
            ctx["comm"].Barrier()  # the others sent their requests first
            time.sleep(0.2)
            client.create(0, 5, np.array([1.0, 2.0]), "late")
            ctx["comm"].Barrier()  # the others have read variable 5 after their update
            client.pull(0, [5], [out])
            np.testing.assert_array_equal(out, np.array([1.0, 2.0]) + 10.0 * others)
        else:
            client.update(0, 5, "add", np.full(2, 10.0))  # parked until the CREATE
            ctx["comm"].Barrier()
            (version,) = client.pull(0, [5], [out])  # parked behind the update
            assert 1 <= version <= others and out[0] >= 11.0
            ctx["comm"].Barrier()
            with pytest.raises(PSError, match="never created"):
                client.pull(0, [99], [out])  # nobody creates 99: fails once all others wait
        return True

    ps_job(1, body)


def sgd_momentum_adam():
    return [SGD(0.1), SGD(0.05, momentum=0.9), Adam(0.01)]


def reference(opt, p, grads, lrs):
    """Keras formulas in float64, applied in order."""
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, (g, lr) in enumerate(zip(grads, lrs, strict=True)):
        if isinstance(opt, Adam):
            m += (g - m) * (1 - opt.beta_1)
            v += (g * g - v) * (1 - opt.beta_2)
            lr_t = lr * math.sqrt(1 - opt.beta_2 ** (t + 1)) / (1 - opt.beta_1 ** (t + 1))
            p = p - lr_t * m / (np.sqrt(v) + opt.epsilon)
        elif opt.momentum:
            m = opt.momentum * m - lr * g
            p = p + m
        else:
            p = p - lr * g
    return p


def grads_of(client_index, steps, shape):
    rng = np.random.default_rng(100 + client_index)
    return [rng.standard_normal(shape) for _ in range(steps)]


def test_apply_on_the_ps_matches_numpy_for_one_client():
    steps = 6
    lrs = [0.1 * (1 + t % 3) for t in range(steps)]
    p0 = np.linspace(-1, 1, 12).reshape(4, 3)

    def body(client, ctx):
        for opt_id, opt in enumerate(sgd_momentum_adam()):
            client.register_optimizer(opt_id, type(opt).__name__, opt.get_config())
            client.create(0, opt_id, p0, f"w{opt_id}")
        client.create(0, 9, np.zeros(2, np.float32), "f32")
        if ctx["init"]:
            grads = grads_of(0, steps, p0.shape)
            for t in range(steps):
                for opt_id in range(3):
                    client.apply(0, opt_id, [opt_id], [grads[t]], lrs[t], [t])
            client.apply(0, 0, [9], [np.ones(2, np.float32)], 0.5, [0])
            out = np.empty_like(p0)
            for opt_id, opt in enumerate(sgd_momentum_adam()):
                assert client.pull(0, [opt_id], [out]) == [steps]
                np.testing.assert_allclose(
                    out, reference(opt, p0, grads, lrs), rtol=1e-12, atol=1e-14
                )
            f = np.empty(2, np.float32)
            client.pull(0, [9], [f])
            np.testing.assert_array_equal(f, [-0.5, -0.5])
            # An int gradient is refused at once; an unknown optimizer at the next request.
            with pytest.raises(TypeError, match="float32 and float64"):
                client.apply(0, 0, [0], [np.ones((4, 3), np.int64)], 0.1, [0])
            client.apply(0, 42, [0], [np.ones((4, 3))], 0.1, [0])
            with pytest.raises(PSError, match="no optimizer is registered with id 42"):
                client.stats(0)
            client.pull(0, [0], [out])
            np.testing.assert_allclose(out, reference(SGD(0.1), p0, grads, lrs), rtol=1e-12)
        return True

    role, res = ps_job(1, body)
    if role == "ps":
        assert res["applies"] == 3 * steps + 1


def test_plain_sgd_from_many_clients_sums_every_update():
    steps, lr = 20, 0.01
    p0 = np.arange(6, dtype=np.float64)

    def body(client, ctx):
        client.register_optimizer(0, "SGD", SGD(lr).get_config())
        client.register_optimizer(1, "Adam", Adam().get_config())  # a second client: idempotent
        client.create(0, 0, p0, "w")
        mine = grads_of(ctx["index"], steps, p0.shape)
        for g in mine:
            client.apply(0, 0, [0], [g], lr, [0])
        sync_point(client, ctx)
        out = np.empty_like(p0)
        (version,) = client.pull(0, [0], [out])
        k = ctx["clients"]
        assert version == k * steps
        total = sum(sum(grads_of(i, steps, p0.shape)) for i in range(k))
        np.testing.assert_allclose(out, p0 - lr * total, rtol=1e-12, atol=1e-12)
        return True

    role, res = ps_job(1, body)
    if role == "ps":
        clients = MPI.COMM_WORLD.Get_size() - 1
        # Every gradient was computed from version 0: the n-th applied has staleness n.
        n = clients * steps
        assert res["staleness_count"] == n
        assert res["staleness_sum"] == n * (n - 1) // 2
        assert res["staleness_max"] == n - 1
        assert sum(res["staleness_hist"]) == n and res["staleness_hist"][-1] == max(0, n - 31)


def test_sparse_apply_and_gather():
    table0 = np.arange(20, dtype=np.float64).reshape(10, 2)
    rows = np.array([3, 7, 3, 0, 3])
    vals = np.arange(10, dtype=np.float64).reshape(5, 2) - 4.0

    def body(client, ctx):
        client.register_optimizer(0, "SGD", SGD(1.0).get_config())
        client.register_optimizer(1, "SGD", SGD(0.1, momentum=0.9).get_config())
        client.create(0, 0, table0, "emb")
        client.create(0, 1, table0, "emb_momentum")
        out = np.empty((4, 2))
        assert client.gather(0, 0, np.array([9, 0, 9, 4]), out) == 0
        np.testing.assert_array_equal(out, table0[[9, 0, 9, 4]])
        ctx["comm"].Barrier()  # every client read version 0 before anyone applies
        client.apply_sparse(0, 0, 0, rows, vals, 0.5, 0)
        if ctx["init"]:
            client.apply_sparse(0, 1, 1, rows, vals, 0.1, 0)
            client.apply_sparse(0, 1, 1, np.array([7]), np.ones((1, 2)), 0.1, 1)
        sync_point(client, ctx)
        k = ctx["clients"]
        dense = np.zeros_like(table0)
        np.add.at(dense, rows, vals)
        full = np.empty_like(table0)
        client.pull(0, [0], [full])
        np.testing.assert_allclose(full, table0 - 0.5 * k * dense, rtol=1e-12)
        got = np.empty((3, 2))
        client.gather(0, 0, np.array([3, 3, 5]), got)
        np.testing.assert_array_equal(got, full[[3, 3, 5]])
        # Momentum on rows {0, 3, 7}, then on row 7 only: the others keep their velocity.
        vel = np.zeros_like(table0)
        ref = table0.copy()
        for r_, g_ in ((rows, vals), (np.array([7]), np.ones((1, 2)))):
            gd = np.zeros_like(table0)
            np.add.at(gd, r_, g_)
            touched = np.unique(r_)
            vel[touched] = 0.9 * vel[touched] - 0.1 * gd[touched]
            ref[touched] += vel[touched]
        client.pull(0, [1], [full])
        np.testing.assert_allclose(full, ref, rtol=1e-12)
        with pytest.raises(PSError, match=r"rows must lie in \[0, 10\)"):
            client.gather(0, 0, np.array([10]), np.empty((1, 2)))
        with pytest.raises(PSError, match="one row of values per index"):
            client.apply_sparse(0, 0, 0, np.array([1, 2]), np.ones((3, 2)), 0.1, 0)
        return True

    ps_job(1, body)


def test_close_is_idempotent_and_a_closed_client_refuses_requests():
    def body(client, ctx):
        client.create(0, 0, np.zeros(2), "w")
        client.close()
        client.close()
        assert client.closed
        with pytest.raises(PSError, match="closed"):
            client.pull(0, [0], [np.empty(2)])
        with pytest.raises(PSError, match="closed"):
            client.update(0, 0, "add", np.ones(2))
        return True

    role, res = ps_job(1, body)  # ps_job closes once more: still fine
    if role == "ps":
        assert res["variables"] == 1 and res["updates"] == 0


def test_threads_share_one_client():
    threads, n = 4, 250

    def body(client, ctx):
        client.create(0, 0, np.zeros((), np.int64), "count")
        client.create(0, 1, np.arange(1000.0), "big")
        errors = []

        def work():
            try:
                out = np.empty(1000)
                for i in range(n):
                    client.update(0, 0, "add", np.ones((), np.int64))
                    if i % 25 == 0:
                        client.pull(0, [1], [out])  # a reply never mixes with another's
                        np.testing.assert_array_equal(out, np.arange(1000.0))
            except Exception as e:  # reported below, on the main thread
                errors.append(e)

        pool = [threading.Thread(target=work) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert not errors, errors
        sync_point(client, ctx)
        out = np.empty((), np.int64)
        client.pull(0, [0], [out])
        assert int(out) == threads * n * ctx["clients"]
        return True

    ps_job(1, body)
