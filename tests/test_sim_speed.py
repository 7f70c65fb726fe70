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
import inspect
import io
import json
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


# ---- what a run without logs leaves out, and that it changes nothing else ----

@pytest.mark.parametrize("argv", [
    ["--topology", "exponential", "-n", "16", "--iterations", "25", "--backup-workers", "1", "--skip",
     "max-jump=3,trigger=2", "--slowdown", "random:factor=5,prob=1/n", "--bandwidth", "1", "--message-mb", "4"],
    ["--topology", "ring", "-n", "8", "--iterations", "20", "--protocol", "notify-ack", "--compute-graph", "serial"],
])
def test_a_run_without_logs_summarises_as_a_run_with_logs(argv, tmp_path):
    """Without --log-dir the loop builds lean records (``worker_loop(detail=False)``) and keeps no
    (time, iteration) list per worker: every figure of the summary is the one a run with logs prints."""
    lean = simulate(parse(argv), out=io.StringIO())
    full = simulate(parse(argv + ["--log-dir", str(tmp_path / "logs")]), out=io.StringIO())
    assert lean["sim"].detail is False and full["sim"].detail is True
    assert lean["rows"] == full["rows"]
    assert (lean["virtual_s"], lean["max_gap"], lean["events"]) == (full["virtual_s"], full["max_gap"],
                                                                    full["events"])
    recs = [json.loads(line) for line in open(tmp_path / "logs" / "rank3.jsonl")]
    recs = [r for r in recs if "iter" in r]
    assert recs and all("reduced" in r and "held" in r for r in recs)    # the logs keep every field


def test_a_lean_record_is_the_full_one_without_the_log_only_fields():
    from hopdec.hop.config import ProtocolConfig
    from hopdec.hop.worker import node_views
    from hopdec.runtime.hop_loop import worker_loop
    from hopdec.sim.hop import HopSim
    from hopdec.topology.generators import ring_based
    views = node_views(ring_based(8))
    recs = {True: [], False: []}
    for detail in (True, False):
        HopSim(views, ProtocolConfig(iterations=8), lambda r, k: 0.1 * (3 if r == 2 else 1),
               network=LinkModel(bandwidth=1e6, latency=1e-3), message_bytes=1e5,
               on_record=lambda r, rec, d=detail: recs[d].append(rec), detail=detail).run()
    log_only = {"reduced", "sent_to", "sent_bytes", "waited_on", "tokens", "held", "used_total", "dropped_total"}
    assert len(recs[True]) == len(recs[False]) == 64
    assert not any(log_only & set(r) for r in recs[False])
    assert any("waited_on" in r for r in recs[True])            # the slow worker made others wait
    for a, b in zip(recs[True], recs[False]):
        assert log_only - {"waited_on"} <= set(a)
        assert {k: v for k, v in a.items() if k not in log_only} == b
    assert inspect.signature(worker_loop).parameters["detail"].default is True     # MPI runs log everything


def test_compute_draws_from_the_block_equal_the_base_times_the_factor_in_any_order():
    """``ComputeModel.step`` reads a per-worker block; going back (a resumed or replayed worker) still gives
    the same numbers as ``base * factor``."""
    from hopdec.sim.costs import ComputeModel
    for slow in (None, ["random:factor=4,prob=0.3"]):
        m = ComputeModel(["normal:mean=0.2,std=0.05"], range(4), seed=5, slowdowns=slow)
        fresh = ComputeModel(["normal:mean=0.2,std=0.05"], range(4), seed=5, slowdowns=slow)
        rng = random.Random(1)
        for _ in range(400):
            w, i = rng.randrange(4), rng.choice([rng.randrange(600), rng.randrange(3)])
            t, f = m.step(w, i)
            assert (t, f) == (fresh.base(w, i) * fresh.factor(w, i), fresh.factor(w, i))


def test_actions_are_immutable_records_equal_only_to_their_own_kind():
    """``hopdec.core.action`` builds tuples: keyword and positional fields, defaults, equality and hash by
    kind and value, repr, copies and pickles, ``_replace``; assigning a field raises; an action equals no
    action of another kind with the same fields (nor a plain tuple), and every action is true."""
    import copy
    import pickle
    from hopdec.core import ApplyGradient, ComputeGradient, Finished
    from hopdec.hop.actions import Enter, Jump, SendParams
    from hopdec.hop.receive import Term
    t = Term(1, 2, None, 0.5)
    assert t == Term(sender=1, iteration=2, handle=None, weight=0.5) and hash(t) == hash(Term(1, 2, None, 0.5))
    assert Term.make((1, 2, None, 0.5)) == t and type(Term.make((1, 2, None, 0.5))) is Term
    assert repr(t) == "Term(sender=1, iteration=2, handle=None, weight=0.5)"
    assert Enter(3).jumped_from is None and SendParams(1, (2,)).skipped == ()
    assert copy.copy(t) == t == pickle.loads(pickle.dumps(t))
    assert t._replace(weight=1.0).weight == 1.0
    with pytest.raises(AttributeError):
        t.weight = 2.0
    with pytest.raises(AttributeError):
        t.extra = 1                                       # no __dict__ either
    with pytest.raises(TypeError):
        Term(1, 2, None)                                  # a missing field is refused as before
    assert ComputeGradient(5) != ApplyGradient(5) and not ComputeGradient(5) == ApplyGradient(5)
    assert Enter(3, 4) != Jump(3, 4) and Enter(3) != (3, None) and (3, None) != Enter(3)
    assert len({ComputeGradient(5), ApplyGradient(5), ComputeGradient(5)}) == 2
    assert bool(Finished()) and Finished() == Finished() and Finished() != ()


def test_an_action_with_a_default_before_a_field_without_is_refused():
    from hopdec.core import action
    with pytest.raises(TypeError, match="defaults must come last"):
        @action
        class Bad:
            a: int = 1
            b: int


def test_no_automatic_collection_while_a_large_run_is_built_and_started():
    """Building n workers and their first steps makes O(n) objects without cycles; Python's collector used
    to walk them all in full collections before the events ran (0.6-0.8 s at 10,000 workers). It is paused
    from the build to the end of the run, as while events run, and back on after."""
    import gc
    seen = []

    def watch(phase, info):
        if phase == "start":
            seen.append(info["generation"])
    gc.collect()
    gc.callbacks.append(watch)
    try:
        simulate(parse(["--topology", "ring-based", "-n", "3000", "--iterations", "2", "--invariants", "off",
                        "--no-progress"]), out=io.StringIO())
    finally:
        gc.callbacks.remove(watch)
    assert 2 not in seen and len(seen) < 100 and gc.isenabled()     # before: 400 collections, full ones among them


def test_bench_count_reads_cachegrinds_summary_and_refuses_bad_lengths(monkeypatch):
    """``bench_sim.py --count`` reads cachegrind's summary (valgrind 3.19's format, a process's stderr) into
    totals, and a bad ``--count-iterations`` or case is one line and a non-zero exit, before valgrind runs."""
    import os
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
    import bench_sim

    summary = """==6485== I   refs:      16,108,459,041
==6485== I1  misses:       12,345
==6485== D   refs:       7,599,620,469  (5,167,721,444 rd   + 2,431,899,025 wr)
==6485== D1  misses:       202,832,510  (  181,910,502 rd   +    20,922,008 wr)
==6485== LLd misses:        20,000,000  (   17,071,148 rd   +     3,457,056 wr)
==6485== LL misses:         20,528,204  (   17,071,148 rd   +     3,457,056 wr)
"""

    class Done:
        returncode = 0

        def communicate(self):
            return "", summary

    assert bench_sim._totals(Done(), "ring128") == {"I   refs": 16108459041, "D   refs": 7599620469,
                                                    "D1  misses": 202832510, "LL misses": 20528204}
    Done.returncode = 1
    with pytest.raises(SystemExit, match="ring128 failed under valgrind"):
        bench_sim._totals(Done(), "ring128")
    for argv, says in [(["--count", "ring128", "--count-iterations", "5"], "--count-iterations 5: two lengths"),
                       (["--count", "ring128", "--count-iterations", "9,3"], "1 <= LO < HI"),
                       (["--count", "nope"], "--count: unknown case 'nope'")]:
        with pytest.raises(SystemExit, match=says):
            bench_sim.main(argv)


def test_bench_opcodes_counts_each_functions_bytecodes_per_worker_iteration(monkeypatch, capsys):
    """``bench_sim.py --opcodes`` counts Python bytecodes per function in two fresh runs of different lengths
    and divides their difference by the worker-iterations between them: start-up, imports and the summary
    cancel; small functions stay in the total but not in the list."""
    import os
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
    import bench_sim

    total, rows = bench_sim.per_function({"f": 10, "g": 5, "h": 1}, {"f": 30, "g": 6, "h": 1, "k": 4}, 4)
    assert total == 6.25 and rows == [(5.0, "f"), (1.0, "k")]      # g's 0.25 is in the total only
    bench_sim.main(["--opcodes", "ring128", "--count-iterations", "2,3"])
    lines = capsys.readouterr().out.splitlines()
    head = lines[0]
    assert head.startswith("ring128: ") and "bytecodes per worker-iteration (128 workers, iterations 2..3)" in head
    total = float(head.split()[1].replace(",", ""))
    listed = {line.split()[-1]: float(line.split()[0].replace(",", "")) for line in lines[1:]}
    assert 500 < total < 20000 and 100 < listed["worker_loop"] < total      # the shared loop runs every iteration
    assert sum(listed.values()) <= total + 1
    for argv, says in [(["--opcodes", "ring128", "--count", "ring128"], "one at a time"),
                       (["--opcodes", "nope"], "--opcodes: unknown case 'nope'"),
                       (["--opcodes", "ring128", "--count-iterations", "3,3"], "1 <= LO < HI")]:
        with pytest.raises(SystemExit, match=says):
            bench_sim.main(argv)
