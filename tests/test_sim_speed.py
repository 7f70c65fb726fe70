"""What the simulator's speed rests on (the speed itself is measured by experiments/bench_sim.py).

* Its events make no reference cycles: :class:`hopdec.sim.events.EventQueue` pauses Python's automatic
  cycle collector while it runs (full collections walk every live object, O(n) each), which is only
  safe because reference counting frees everything a simulated iteration allocates.
* The collector is back on after a run, also when an event raised.
* A send rated alone stays off the NICs' books until something else needs them
  (:meth:`hopdec.sim.network.Network._solo_send`): traffic built to hit every moment around such a send
  -- before its last byte leaves, between then and its arrival, at its arrival -- from the same sender,
  to the same receiver and on the same pair, arrives exactly when the direct model says.
"""

import gc
import io
import random

import pytest

from hopdec.cli.sim import parse
from hopdec.sim.events import EventQueue
from hopdec.sim.network import LinkModel
from hopdec.sim.run import simulate
from test_sim import reference_network, transfers

MB = 1e6


@pytest.mark.parametrize("argv", [
    ["--topology", "ring-based", "-n", "16", "--iterations", "20", "--bandwidth", "1", "--message-mb", "4",
     "--compute-time", "normal:mean=0.03,std=0.01", "--slowdown", "rank=2,factor=3"],
    ["--topology", "exponential", "-n", "16", "--iterations", "20", "--staleness", "2", "--skip",
     "max-jump=3,trigger=2", "--slowdown", "random:factor=5,prob=1/n"],
    ["--topology", "exponential", "-n", "16", "--iterations", "20", "--rendezvous", "push", "--backup-workers",
     "1", "--bandwidth", "1", "--message-mb", "4", "--slowdown", "rank=2,factor=3"],
    ["--topology", "one-peer-exponential", "-n", "16", "--iterations", "20", "--compress", "topk:0.1",
     "--bandwidth", "1", "--message-mb", "4"],
    ["--mode", "ps", "--sync", "esync", "-n", "8", "--iterations", "20"],
    ["--mode", "ps", "--sync", "bsp", "-n", "8", "--iterations", "20", "--bandwidth", "1"],
])
def test_a_simulation_makes_no_reference_cycles(argv):
    from hopdec.sim import hop, ps
    found = []

    def counting(cls):
        run = cls.run

        def wrapped(self, *a, **k):
            gc.collect()
            try:
                return run(self, *a, **k)
            finally:
                found.append(gc.collect())
        return wrapped
    saved = hop.HopSim.run, ps.PSSim.run
    hop.HopSim.run, ps.PSSim.run = counting(hop.HopSim), counting(ps.PSSim)
    try:
        simulate(parse(argv + ["--invariants", "off"]), out=io.StringIO())
    finally:
        hop.HopSim.run, ps.PSSim.run = saved
    assert found == [0]


def test_the_collector_is_paused_during_a_run_and_back_after_it_even_on_errors():
    q, seen = EventQueue(), []
    q.at(1.0, lambda: seen.append(gc.isenabled()))
    q.run()
    assert seen == [False] and gc.isenabled()

    def boom():
        raise RuntimeError("boom")
    q.at(2.0, boom)
    with pytest.raises(RuntimeError):
        q.run()
    assert gc.isenabled()
    gc.disable()                    # a caller that paused it itself keeps it paused
    try:
        q.at(3.0, lambda: None)
        q.run()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("seed", range(60))
def test_sends_around_one_rated_alone_arrive_as_the_direct_model_says(seed):
    """A first send from node 0 to 1 and 2 (rated alone), then sends placed in every window around it."""
    rng = random.Random(seed)
    n = 4
    latency = rng.choice([0.05, 0.3])
    model = LinkModel(bandwidth=MB, latency=latency, duplex=rng.choice(["full", "half"]),
                      node_bandwidth={3: MB / 2} if rng.random() < 0.5 else {},
                      links={(0, 2): (MB / 4, None)} if rng.random() < 0.3 else {})
    sends = [(0.0, 0, (1, 2), MB)]               # alone: its last byte leaves at 2.0 (MB/s shared by two)
    moments = [1.0, 2.0, 2.0 + latency / 2, 2.0 + latency, 2.5, rng.uniform(0, 3)]
    for t in rng.sample(moments, rng.randint(1, 4)):
        src, dsts = rng.choice([(0, (1,)), (0, (2, 1)), (3, (1,)), (1, (2,)), (3, (0,)), (2, (3, 1))])
        sends.append((t, src, dsts, rng.choice([MB / 4, MB])))
    sends = list({(t, s): (t, s, d, b) for t, s, d, b in sends}.values())
    want = reference_network(n, sends, model)
    got = transfers(n, sends, model)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-9), (k, got[k], want[k])
