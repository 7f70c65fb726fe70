"""Compressed exchanges (``--compress``): the codecs, the per-edge streams with error feedback, the core with
Choco's consensus step, the protocol under every mechanism with coded streams (in-process, invariants after
every step), and the simulator's message sizes. The MPI transport's bytes are in test_compress_mpi.py."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from hopdec import topology as T
from hopdec.errors import ConfigError
from hopdec.hop.config import ProtocolConfig, check_config
from hopdec.hop.receive import SELF, Term, damped
from hopdec.hop.worker import node_views
from hopdec.sim.inproc import InProcNetwork, ToyBackend
from hopdec.transport import codec as C
from hopdec.transport.streams import ReceiverStreams, SenderStreams, StreamOrderError

from test_protocol import Invariants
from test_protocol_directed import strong_digraphs
from test_time_varying import schedules

CODECS = ["fp16", "bf16", "int8", "topk:0.1"]


def coded(spec, delta):
    c = C.make_codec(spec, len(delta))
    out = np.empty(c.payload_bytes, dtype=np.uint8)
    c.encode(np.asarray(delta, dtype=np.float32), out)
    back = np.zeros(len(delta), dtype=np.float32)
    c.decode_add(out, back)
    return c, back


# ---- codecs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 7, 256, 1000, 70001])
def test_codecs_are_as_small_and_as_exact_as_documented(n):
    rng = np.random.default_rng(n)
    d = (rng.normal(size=n) * 10.0 ** rng.integers(-5, 1, size=n)).astype(np.float32)
    c, back = coded("fp16", d)
    assert c.message_bytes() == 32 + 2 * n
    assert np.all(np.abs(back - d) <= np.maximum(np.abs(d) * 2 ** -11, 2 ** -25))
    c, back = coded("bf16", d)
    assert c.message_bytes() == 32 + 2 * n
    assert np.all(np.abs(back - d) <= np.abs(d) * 2 ** -8)
    c, back = coded("int8", d)
    chunks = -(-n // C.INT8_CHUNK)
    assert c.message_bytes() == 32 + 4 * chunks + n
    pad = np.zeros(chunks * C.INT8_CHUNK, dtype=np.float32)
    pad[:n] = d
    half_step = np.repeat(np.abs(pad.reshape(chunks, -1)).max(1) / 127 / 2, C.INT8_CHUNK)[:n]
    assert np.all(np.abs(back - d) <= half_step * (1 + 1e-6) + 1e-30)
    c, back = coded("topk:0.01", d)
    k = max(1, int(np.ceil(0.01 * n)))
    assert c.message_bytes() == 32 + 8 * k
    kept = np.flatnonzero(back)
    assert len(kept) <= k and np.array_equal(back[kept], d[kept])
    if len(kept) < n:                               # what it kept is at least what it left out
        assert np.abs(d[kept]).min() >= np.abs(np.delete(d, kept)).max()


def test_fp16_saturates_instead_of_sending_infinity():
    _, back = coded("fp16", [1e6, -1e9, 1.0])
    assert back.tolist() == [65504.0, -65504.0, 1.0]


@pytest.mark.parametrize("text,codec,fraction,gamma", [
    ("none", "none", None, 1.0), ("bf16", "bf16", None, 1.0), ("int8,gamma=0.5", "int8", None, 0.5),
    ("topk:0.01", "topk", 0.01, C.default_gamma("topk", 0.01)), ("topk:0.5,gamma=1", "topk", 0.5, 1.0)])
def test_compress_specs(text, codec, fraction, gamma):
    s = C.parse_compress(text)
    assert (s.codec, s.fraction, s.gamma) == (codec, fraction, gamma)
    assert C.parse_compress(str(s)) == s


@pytest.mark.parametrize("bad", ["int4", "topk", "topk:0", "topk:1.5", "topk:x", "int8:3", "int8,gamma=0",
                                 "int8,gamma=2", "int8,beta=1", "none,gamma=0.5"])
def test_bad_compress_specs_name_the_option(bad):
    with pytest.raises(ConfigError, match="--compress"):
        C.parse_compress(bad)


# ---- streams: error feedback -------------------------------------------------------------------

def send_walk(spec, steps=350, n=2000, seed=0, step=1e-3):
    """One edge's stream carrying a random walk x_t: the error between x_t and the receiver's copy."""
    rng = np.random.default_rng(seed)
    codec = C.make_codec(spec, n)
    tx, rx = SenderStreams(codec, n), ReceiverStreams(codec, n)
    x = rng.normal(size=n).astype(np.float32)
    errs = []
    for t in range(steps):
        (ds, buf, nbytes), = tx.encode(x, [1])
        h = C.header(buf)
        assert rx.arrive(0, h[C.SEQ], h[C.KIND], C.payload(buf), t) == [t]
        copy = rx.value(0, h[C.SEQ])
        assert np.array_equal(copy, tx.mirror_of(1))            # both ends hold the same copy, bit for bit
        errs.append(float(np.linalg.norm(x - copy)))
        if t < 240:                                  # then 110 messages of a sender at rest
            x = x + (rng.normal(size=n) * step).astype(np.float32)
    return np.array(errs)


@pytest.mark.parametrize("spec", CODECS + ["topk:0.01"])
def test_error_feedback_keeps_the_copys_error_bounded_and_it_vanishes_when_the_sender_stops(spec):
    errs = send_walk(spec)
    assert errs[0] == 0.0                                       # the key: exact
    moving = errs[1:240]
    # bounded: no drift -- the second half's error is no larger than the first's (give or take noise)
    assert moving[120:].max() <= 1.5 * moving[:120].max() + 1e-9
    # with the sender at rest the error left over is sent on and decays (top-k: gone after 1/F messages,
    # here 100)
    assert errs[-1] <= 0.05 * moving.max() + 1e-6


def test_without_error_feedback_the_copy_would_drift():
    """The reference the test above beats: quantizing each step's change on its own (no feedback) lets the
    errors of int8's rounding add up like a random walk."""
    rng = np.random.default_rng(0)
    n, x, copy = 2000, np.zeros(2000, np.float32), np.zeros(2000, np.float32)
    errs = []
    for t in range(240):
        step = (rng.normal(size=n) * 1e-3).astype(np.float32)
        x += step
        _, back = coded("int8", step)
        copy += back
        errs.append(np.linalg.norm(x - copy))
    with_ef = send_walk("int8")[1:240]
    assert errs[-1] > 3 * errs[10] and errs[-1] > 3 * with_ef.max()


def test_receivers_get_updates_in_stream_order_and_fold_them_lazily():
    n = 8
    codec = C.make_codec("int8", n)
    tx, rx = SenderStreams(codec, n), ReceiverStreams(codec, n)
    msgs = []
    for t in range(4):
        (_, buf, _), = tx.encode(np.full(n, float(t + 1), np.float32), [5])
        msgs.append(buf)
    args = [(C.header(b)[C.SEQ], C.header(b)[C.KIND], C.payload(b)) for b in msgs]
    assert rx.arrive(0, *args[1], "m1") == []                  # ahead of its key: waits
    assert rx.arrive(0, *args[0], "m0") == ["m0", "m1"]
    assert rx.arrive(0, *args[2], "m2") == ["m2"]
    assert rx.value(0, 1)[0] == pytest.approx(2.0)             # message 1's state, though 2 arrived
    rx.done(0, 2)                                              # freed unused: folded all the same
    assert rx.arrive(0, *args[3], "m3") == ["m3"]
    assert rx.value(0, 3)[0] == pytest.approx(4.0)
    with pytest.raises(StreamOrderError):
        rx.value(0, 2)


def test_out_neighbours_share_a_mirror_until_they_are_sent_different_things():
    n = 16
    tx = SenderStreams(C.make_codec("bf16", n), n)
    x = np.ones(n, np.float32)
    assert [m[0] for m in tx.encode(x, [1, 2, 3])] == [(1, 2, 3)]          # one key for all
    assert [m[0] for m in tx.encode(x + 1, [1, 2, 3])] == [(1, 2, 3)] and tx.mirrors == 1
    assert [m[0] for m in tx.encode(x + 2, [1, 3])] == [(1, 3)] and tx.mirrors == 2   # 2 left out: split
    assert sorted(m[0] for m in tx.encode(x + 3, [1, 2, 3, 4])) == [(1, 3), (2,), (4,)]
    assert tx.keys_sent == 4


# ---- the core ----------------------------------------------------------------------------------

def test_the_consensus_step_moves_gamma_of_the_way_to_the_average():
    terms = (Term(0, 4, SELF, 0.25), Term(1, 4, 11, 0.25), Term(2, 3, 12, 0.5))
    assert damped(terms, 1.0) is terms
    w = [t.weight for t in damped(terms, 0.2)]
    assert w == pytest.approx([0.8 + 0.05, 0.05, 0.1]) and sum(w) == pytest.approx(1.0)


def gossip(graph, spec, iterations, dim=64, seed=0, **cfg):
    """Pure gossip (lr 0) from different starting points through coded streams."""
    spec = C.parse_compress(spec)
    cfg = ProtocolConfig(iterations=iterations, compress=str(spec), consensus_step=spec.gamma, **cfg)
    backends = {}

    def make(r):
        b = backends[r] = ToyBackend(r, dim=dim, lr=0.0, seed=seed)
        b.x = b.target.copy()
        return b
    net = InProcNetwork(node_views(graph), cfg, seed=seed, backend_factory=make, compress=spec, numel=dim)
    net.run()
    xs = np.array([backends[r].x for r in sorted(backends)])
    start = np.array([backends[r].target for r in sorted(backends)])
    return xs, start


@pytest.mark.parametrize("spec,drift", [("topk:0.1", 0.15), ("topk:0.02", 0.2), ("int8", 1e-3), ("bf16", 1e-3)])
def test_gossip_through_coded_streams_reaches_consensus_on_a_fixed_graph(spec, drift):
    xs, start = gossip(T.ring(8), spec, 400)
    spread0 = np.linalg.norm(start - start.mean(0))
    assert np.linalg.norm(xs - xs.mean(0)) < 1e-3 * spread0
    # W is doubly stochastic: exact gossip keeps the mean; the copies' lag moves it, within limits
    assert np.linalg.norm(xs.mean(0) - start.mean(0)) < drift * spread0


def test_a_smaller_consensus_step_moves_the_mean_less_and_mixes_slower():
    spread = lambda xs: np.linalg.norm(xs - xs.mean(0))        # noqa: E731
    one, start = gossip(T.ring(8), "topk:0.02", 200)
    small, _ = gossip(T.ring(8), "topk:0.02,gamma=0.1", 200)
    shift = lambda xs: np.linalg.norm(xs.mean(0) - start.mean(0))   # noqa: E731
    assert shift(small) < 0.3 * shift(one)
    assert spread(small) > 10 * spread(one)


# ---- every mechanism through coded streams -------------------------------------------------------

@st.composite
def setups(draw):
    if draw(st.booleans()):
        graph = draw(schedules())
    else:
        graph = draw(strong_digraphs())
    backup = draw(st.sampled_from([0, 0, 1]))
    from hopdec.topology.schedule import schedule_of
    s = schedule_of(graph)
    for i in graph.nodes:
        if s is None:
            limit = len(T.in_neighbors(graph, i))
        else:
            degs = [len(s.in_weights_at(m, i)) - 1 for m in range(s.period)]
            limit = min([d for d in degs if d] or [1])
        graph.nodes[i]["backup_workers"] = max(0, min(backup, limit - 1))
    spec = C.parse_compress(draw(st.sampled_from(["bf16", "int8", "topk:0.3", "topk:0.05,gamma=0.5"])))
    skip = draw(st.sampled_from([(0, 2), (3, 1), (20, 1)]))
    staleness = draw(st.sampled_from([None, None, 0, 2]))
    if not staleness and not any(graph.nodes[i]["backup_workers"] for i in graph.nodes):
        skip = (0, 2)           # (skipping needs backup workers or staleness >= 1)
    cfg = ProtocolConfig(iterations=draw(st.integers(6, 25)), max_ig=draw(st.integers(1, 3)),
                         compute_graph=draw(st.sampled_from(["parallel", "serial"])),
                         staleness=staleness, skip_max_jump=skip[0],
                         skip_trigger=skip[1], compress=str(spec), consensus_step=spec.gamma)
    return graph, cfg, spec


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_every_mechanism_runs_through_coded_streams_with_the_invariants(data):
    graph, cfg, spec = data.draw(setups(), label="setup")
    n = graph.number_of_nodes()
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")
    straggler = data.draw(st.integers(0, n - 1), label="straggler")
    note(f"edges {sorted((u, v) for u, v in graph.edges if u != v)}")
    views = node_views(graph)
    check_config(cfg, views)
    net = InProcNetwork(views, cfg, seed=seed, check=Invariants(graph, cfg), compress=spec, numel=5,
                        speeds=[0.1 if r == straggler else 1.0 for r in range(n)], carry_grants=seed % 2 == 1,
                        backend_factory=lambda r: ToyBackend(r, dim=5, seed=seed))
    net.run()
    assert net.iterations() == [cfg.iterations - 1] * n
    for r, io in enumerate(net.ios):               # a receiver that got all of a sender's messages holds,
        rx = io.ends.rx                              # once it folds them, exactly that sender's mirror for it
        for sender in rx.copy:
            tx = net.ios[sender].ends.tx
            last = tx.group_of[r].seq - 1
            if rx._expect[sender] == last + 1:
                assert np.array_equal(rx.value(sender, last), tx.mirror_of(r))
    assert all(np.isfinite(b.x).all() for b in net.backends)


# ---- the simulator: each message costs its coded size ---------------------------------------------

def test_the_simulator_charges_each_message_its_coded_size():
    from hopdec.sim.hop import HopSim
    from hopdec.sim.network import LinkModel
    G = T.ring_based(8)
    numel = 100_000
    sizes = []
    for spec in ("none", "int8", "topk:0.01"):
        cfg = ProtocolConfig(iterations=12, compress=spec)
        sim = HopSim(node_views(G), cfg, lambda r, k: 0.01, network=LinkModel(bandwidth=1e6, latency=1e-4),
                     message_bytes=4 * numel, compress=spec, numel=numel)
        sent = []
        send = sim.net.send
        sim.net.send = lambda src, dsts, nbytes, cb: (sent.append((src, len(dsts), nbytes)), send(src, dsts, nbytes, cb))
        sim.run()
        per_worker = [sum(c * b for s, c, b in sent if s == r) for r in range(8)]
        assert per_worker == [io.bytes_sent for io in sim.ios]
        sizes.append((sorted({b for _, _, b in sent}), sim.now))
    (plain, t_plain), (int8, t_int8), (topk, t_topk) = sizes
    assert plain == [4 * numel]
    assert int8 == sorted([C.message_bytes("int8", numel), C.key_bytes(numel)])
    assert topk == sorted([C.message_bytes("topk:0.01", numel), C.key_bytes(numel)])
    assert t_topk < t_int8 < t_plain                  # the link is the bottleneck: smaller is faster


def test_sim_compress_options_and_timing_equals_math(tmp_path):
    import io as _io
    from hopdec.cli.sim import main, parse
    from hopdec.sim.run import simulate

    def sim(argv):
        out = _io.StringIO()
        return simulate(parse([str(a) for a in argv]), out=out), out.getvalue()
    argv = ["--topology", "one-peer-exponential", "-n", "4", "--iterations", "6", "--compress", "int8",
            "--bandwidth", "0.1"]
    timing, text = sim(argv)
    assert "decentralized standard+compress(int8) on one-peer-exponential(4)" in text
    assert "coded to" in text and "traffic:" in text
    math, _ = sim(argv + ["--math"])
    assert math["virtual_s"] == pytest.approx(timing["virtual_s"])        # same sizes, same times
    assert main(["--mode", "ps", "-n", "3", "--compress", "int8"]) == 2
