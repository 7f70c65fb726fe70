"""The pool of send stores on the zero-copy path (issue 21): a worker's Reduce writes a store none of whose
sends is in flight, or a new one up to :func:`hopdec.runtime.hop_loop.store_cap`, and waits only at the cap
-- in the trainer's stores, in the simulator's (the same loop picks the same store), and in a run of the
simulator where the cap is reached. (Real MPI runs: ``tests/test_sim_mpi.py``'s torus straggler case.)"""

import io
import json
import random

import numpy as np
import pytest
import torch

from hopdec.cli.sim import parse
from hopdec.hop.config import ProtocolConfig
from hopdec.hop.worker import Worker, node_views
from hopdec.ml.trainer import FlatModel, FlatSGD, LocalRounds, OuterStep
from hopdec.runtime.hop_loop import store_cap, writable_store
from hopdec.sim.hop import ZeroCopyTimingBackend
from hopdec.sim.run import simulate
from hopdec import topology as T

HEADER = 4          # floats after the values in a message-sized store (as a transport's header)


class BusyIO:
    """A transport's completion test: the stores in ``busy`` (by identity) still have sends in flight."""

    def __init__(self):
        self.busy = []

    def sends_done(self, store):
        return not any(store is b for b in self.busy)

    def wait_sent(self, store):
        self.busy = [b for b in self.busy if b is not store]


def model():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3))
    params = [p for p in net.parameters()]
    m = FlatModel(params, [net[1].running_mean, net[1].running_var], module=net)
    m.use_send_storage(m.numel + HEADER)
    return net, m


def pick(m, io, cap):
    """What the worker loop's Reduce does: a writable store, else (at the cap) the oldest once free."""
    spares = m.spare_stores()
    into, added = writable_store(spares, m, io, cap)
    waited = into is None
    if waited:
        into = spares[0]
        io.wait_sent(into)
    return into, added, waited


def test_the_pool_grows_only_when_every_spare_is_busy_and_never_beyond_the_cap():
    """Many Reduces against random sends in flight: a store is added only when every spare is busy, the
    pool never exceeds the cap (and waits only there), Reduce never writes the current store or a busy
    one, and after all of it the values, every parameter, every averaged buffer and every gradient are
    still views of the right memory, with the values the weighted sums say."""
    net, m = model()
    cap = 5
    rng = random.Random(3)
    bus = BusyIO()
    ref = m.values().clone()
    other = np.linspace(-1, 1, m.numel, dtype=np.float32)
    grown = waits = 0
    for k in range(300):
        if rng.random() < 0.8:                          # SendParams from the current store, to a slow peer
            bus.busy.append(m.send_storage())
        spares = m.spare_stores()
        all_busy = not any(bus.sends_done(s) for s in spares)
        before = m.stores
        into, added, waited = pick(m, bus, cap)
        assert added == (all_busy and before < cap) and m.stores == before + added <= cap
        assert waited == (all_busy and before == cap)
        assert into is not m.send_storage() and bus.sends_done(into)
        m.reduce([(None, 0.5), (other, 0.5)], into=into)
        assert m.send_storage() is into
        ref = 0.5 * ref + 0.5 * torch.from_numpy(other)
        grown, waits = grown + added, waits + waited
        while bus.busy and rng.random() < 0.45:         # receivers take the oldest sends
            bus.busy.pop(0)
    assert grown == cap - 2 and waits > 0               # it did grow to the cap, and waited there
    cur = torch.from_numpy(m.send_storage())
    assert torch.equal(m.values(), ref) and m.values().data_ptr() == cur.data_ptr()
    params = list(net.parameters())
    off = 0
    for t in params + [net[1].running_mean, net[1].running_var]:
        assert t.data_ptr() == cur.data_ptr() + 4 * off
        off += t.numel()
    g = 0
    for p in params:
        assert p.grad.data_ptr() == m.flat.grad.data_ptr() + 4 * g
        g += p.numel()
    assert m.expected_pointers() == [(t, t.data_ptr()) for t, _ in m.expected_pointers()]
    m.load_values(np.arange(m.numel, dtype=np.float32))
    assert np.array_equal(m.write_params(), np.arange(m.numel, dtype=np.float32))
    assert np.array_equal(torch.cat([p.detach().reshape(-1) for p in params]).numpy(),
                          np.arange(m.numel_params, dtype=np.float32))


def test_no_store_is_added_while_a_spare_is_free():
    """Receivers that take every update before the next Reduce: two stores, alternating, as before."""
    _, m = model()
    bus = BusyIO()
    seen = set()
    for _ in range(20):
        bus.busy = [m.send_storage()]                   # in flight while its successor is written
        into, added, waited = pick(m, bus, store_cap(Worker(node_views(T.ring(4))[0], ProtocolConfig(iterations=10))))
        seen.add(id(into))
        m.reduce([(None, 1.0)], into=into)
    assert m.stores == 2 and len(seen) == 2


def test_the_simulator_and_the_trainer_pick_the_same_stores():
    """The simulator's pool (stores as indices) and the trainer's (arrays), driven by the same loop code
    through the same sends in flight, write the same store at every Reduce and grow alike."""
    _, m = model()
    sim = ZeroCopyTimingBackend(0, 0.1, [0, 0])
    rng = random.Random(7)
    busy_idx = set()
    cap = 4

    class IndexIO:
        def sends_done(self, store):
            return store not in busy_idx

        def wait_sent(self, store):
            busy_idx.discard(store)

    class ArrayIO(IndexIO):
        def sends_done(self, store):
            return m._index_any(store) not in busy_idx

        def wait_sent(self, store):
            busy_idx.discard(m._index_any(store))

    m._index_any = lambda s: next(i for i, x in enumerate(m._stores) if x is s)
    for _ in range(200):
        if rng.random() < 0.7:
            busy_idx.add(sim.send_storage())
        assert m._index_any(m.send_storage()) == sim.send_storage()
        snapshot = set(busy_idx)
        s_into, s_added, _ = pick(sim, IndexIO(), cap)
        busy_idx.clear()
        busy_idx.update(snapshot)
        a_into, a_added, _ = pick(m, ArrayIO(), cap)
        assert m._index_any(a_into) == s_into and a_added == s_added
        sim.reduce([], into=s_into)
        m.reduce([(None, 1.0)], into=a_into)
        busy_idx = {b for b in busy_idx if rng.random() < 0.6}
    assert m.stores == sim.stores == cap


def test_local_steps_and_checkpoints_with_a_grown_pool():
    """Local steps train a copy (``views_on``) while the values are sent; with more than two stores the
    round's anchor is still the store it began on, and a checkpoint's state round-trips."""
    torch.manual_seed(1)
    net = torch.nn.Linear(6, 3)
    m = FlatSGD(net, lr=0.1)
    m.use_send_storage(m.numel + HEADER)
    for _ in range(3):
        m.reduce([(None, 1.0)], into=m.add_store())       # a pool of 5
    assert m.stores == 5
    rounds = LocalRounds(m, 2, OuterStep(), "parallel")
    anchor = m.values().clone()
    rounds.begin(0)
    assert net.weight.data_ptr() == rounds.work.data_ptr()  # the inner steps train the copy
    with torch.no_grad():
        rounds.work.add_(1.0)                             # "trained"
    into = m.spare_stores()[-1]
    m.reduce([(None, 0.5), (np.zeros(m.numel, dtype=np.float32), 0.5)], into=into)
    assert net.weight.data_ptr() == rounds.work.data_ptr()  # still on the copy across the Reduce
    assert torch.equal(rounds._anchor(), anchor)
    rounds.taken = 1
    rounds.end(0)
    assert net.weight.data_ptr() == m.values().data_ptr()  # home: the values' store
    assert torch.allclose(m.values(), 0.5 * anchor + 1.0)  # x_bar + (w - a)
    state = m.state()
    m2 = FlatSGD(torch.nn.Linear(6, 3), lr=0.1)
    m2.use_send_storage(m2.numel + HEADER)
    m2.load_state(state)
    assert np.array_equal(m2.write_params(), m.write_params())


def test_store_cap_follows_the_receive_slots():
    """slots + 1: max_ig + 2 with token queues, 2 with notify-ack (one outstanding update)."""
    view = node_views(T.ring(4))[0]
    assert store_cap(Worker(view, ProtocolConfig(iterations=10, max_ig=3))) == 5
    assert store_cap(Worker(view, ProtocolConfig(iterations=10, protocol="notify-ack"))) == 2


def sim_logs(tmp_path, argv):
    d = tmp_path / "logs"
    out = io.StringIO()
    simulate(parse(argv + ["--log-dir", str(d), "--overwrite", "--invariants", "on"]), out=out)
    logs = []
    for r in range(8):
        with open(d / f"rank{r}.jsonl") as f:
            logs.append([x for x in map(json.loads, f) if "iter" in x])
    return logs, out.getvalue()


def test_the_simulator_waits_for_sends_only_with_its_pool_at_the_cap(tmp_path, monkeypatch):
    """Random 6x slowdowns with staleness on a ring (max_ig 2): receivers that leave several updates
    untaken. A worker's Reduce waits for sends only in iterations where its pool has reached the cap
    (``max_ig + 2`` = 4 stores), and the pool never exceeds it; with two stores it waited far more."""
    argv = ["--topology", "ring", "-n", "8", "--iterations", "150", "--max-ig", "2", "--compute-time", "0.05",
            "--latency", "0", "--message-mb", "0.5", "--slowdown", "random:factor=6,prob=1/n", "--staleness", "3"]
    logs, text = sim_logs(tmp_path, argv)
    waits = 0
    for recs in logs:
        stores = 2
        for rec in recs:
            stores = rec.get("send_stores", stores)
            assert stores <= 4
            if rec.get("wait_sends_s", 0.0) > 0:
                assert stores == 4, rec
                waits += 1
    assert waits > 0                                      # the cap was reached, and the model waited there
    assert "send stores (zero-copy): " in text and "of at most 4" in text
    import hopdec.runtime.hop_loop as loop
    monkeypatch.setattr(loop, "store_cap", lambda core: 2)
    two, _ = sim_logs(tmp_path, argv)
    assert sum(1 for recs in two for r in recs if r.get("wait_sends_s", 0.0) > 0) > 3 * waits


PATHS_SCRIPT = r'''
import json, sys, time
import numpy as np, torch
from mpi4py import MPI
from hopdec import topology as T
from hopdec.hop.config import ProtocolConfig
from hopdec.hop.worker import Worker, node_views
from hopdec.ml.trainer import FlatModel
from hopdec.runtime.hop_loop import worker_loop
from hopdec.core import Wait
from hopdec.transport.mpi import MPITransport

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
N = 20000                                   # 80 KB messages: rendezvous over shared memory


class Backend:
    """Pool: a FlatModel with send storage (the default path); copy: plain arrays (the send ring)."""

    def __init__(self, pool, io):
        torch.manual_seed(rank)
        self.m = FlatModel([torch.nn.Parameter(torch.randn(N))])
        if pool:
            self.m.use_send_storage(io.message_floats())
            self.send_storage, self.spare_stores, self.add_store = (
                self.m.send_storage, self.m.spare_stores, self.m.add_store)

    def write_params(self, out=None):
        return self.m.write_params(out)

    def compute(self, k):
        time.sleep(0.03 if rank == 2 else 0.001)          # rank 2 is the straggler
        return {"loss": 0.0, "compute_s": 0.0}

    def reduce(self, pairs, into=None):
        self.m.reduce(pairs, into=into)

    def apply(self, k):
        with torch.no_grad():
            self.m.values().mul_(0.5).add_(float(k))


out = {}
for path in ("copy", "pool"):
    view = node_views(T.ring(3))[rank]
    core = Worker(view, ProtocolConfig(iterations=25, max_ig=2))
    # a communicator per run: a rank that finished the first run must not have its next run's messages
    # matched by a neighbour's receives still posted for the first (the test once deadlocked that way)
    io = MPITransport(comm.Dup(), view, N, core.slots, peer_timeout=60)
    b = Backend(path == "pool", io)
    recs = []
    for a in worker_loop(core, io, b, on_record=recs.append):
        if isinstance(a, Wait):
            io.wait(core, a)
    io.close()
    out[path] = dict(values=b.m.write_params().tolist()[:50], ring=len(io.ring), stores=b.m.stores,
                     wait_sends=sum(r.get("wait_sends_s", 0.0) for r in recs))
json.dump(out, open(sys.argv[1] + f"/rank{rank}.json", "w"))
'''


def test_both_send_paths_over_mpi_give_the_same_model(mpirun, tmp_path):
    """Three real ranks on a ring, rank 2 slow, standard training (every Reduce takes iteration k's
    updates): the copying path (a ring of send buffers, made at the first send) and the pool of stores
    compute the same parameters bit for bit; the zero-copy workers never make the ring."""
    script = tmp_path / "paths.py"
    script.write_text(PATHS_SCRIPT)
    proc = mpirun.python(3, [script, tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for r in range(3):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["copy"]["values"] == got["pool"]["values"]
        assert got["copy"]["ring"] == 3 and got["pool"]["ring"] == 0
        assert 2 <= got["pool"]["stores"] <= 4 and got["copy"]["stores"] == 2
