"""The fast paths of the per-worker-iteration code (issue 21 item 4) agree with the general rule they
shortcut, on random inputs: a shortcut that changed a result would change what every run computes.

The simulator's golden runs (tests/test_sim_golden.py) pin whole runs bit for bit; these pin each shortcut
on its own, beyond the inputs those runs happen to reach (random weights, zero self-loops, extra and
missing senders, random orders of puts, takes and floors)."""

import os
import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hopdec.hop.receive import SELF, Standard, Term, _normalised  # noqa: E402
from hopdec.hop.token_queue import TokenLedger  # noqa: E402
from hopdec.hop.update_queue import Entry, IterationSlots  # noqa: E402
from hopdec.sim.backends import compute_record, step_of  # noqa: E402
from hopdec.sim.hop import TimingBackend  # noqa: E402
from hopdec.transport.message import NO_GRANT, split_grants  # noqa: E402


def _split_reference(dests, grants, grantees):
    """split_grants' rule, written out plainly (its docstring): the header carries a count only when every
    destination among the grantees has that very count in ``grants``."""
    if not grants:
        return NO_GRANT, []
    want = dict(grants)
    counts = set()
    for d in dests:
        if d in want:
            counts.add(want[d])
        elif d in grantees:
            return NO_GRANT, list(grants)
    if len(counts) != 1:
        return NO_GRANT, list(grants)
    return counts.pop(), [(i, c) for i, c in grants if i not in dests]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_split_grants_matches_its_rule(data):
    workers = data.draw(st.lists(st.integers(0, 6), min_size=0, max_size=5, unique=True))
    dests = tuple(data.draw(st.permutations(data.draw(st.lists(st.integers(0, 6), max_size=4, unique=True)))))
    count = data.draw(st.integers(0, 3))
    grants = [(i, count if data.draw(st.booleans()) else data.draw(st.integers(0, 3))) for i in sorted(workers)]
    grantees = set(data.draw(st.lists(st.integers(0, 6), max_size=6)))
    assert split_grants(dests, grants, grantees) == _split_reference(dests, grants, grantees)


def test_split_grants_usual_case_carries_the_count():
    assert split_grants((1, 2, 3), [(1, 7), (2, 7), (3, 7)], {1, 2, 3}) == (7, [])
    assert split_grants((1, 2, 3), [(1, 7), (2, 8), (3, 7)], {1, 2, 3}) == (NO_GRANT, [(1, 7), (2, 8), (3, 7)])
    assert split_grants((3, 2, 1), [(1, 7), (2, 7), (3, 7)], {1, 2, 3}) == (7, [])     # any order


def _ops(seed, slots, senders, n=300):
    """A random history of an IterationSlots queue (puts never overflow)."""
    rng = random.Random(seed)
    held, out = set(), []
    low = 0
    for _ in range(n):
        op = rng.random()
        if op < 0.6:
            s, it = rng.choice(senders), low + rng.randrange(slots)
            if all(not (h[0] == s and h[1] % slots == it % slots) for h in held):
                held.add((s, it))
                out.append(("put", s, it))
        elif op < 0.8:
            out.append(("take", None, low + rng.randrange(slots)))
        else:
            low += rng.randrange(3)
            out.append(("drop", None, low))
            held = {h for h in held if h[1] >= low}
    return out


@pytest.mark.parametrize("seed", range(40))
def test_drop_older_scans_only_what_can_be_older_and_finds_the_same(seed):
    """drop_older looks only at the slots of iterations between its last floor and the new one: the same
    entries, in the same order, as a scan of every slot; and take_exactly agrees with take."""
    slots = 1 + seed % 4
    senders = [1, 2, 3]
    fast, full = IterationSlots(slots), IterationSlots(slots)
    for op, s, it in _ops(seed, slots, senders):
        if op == "put":
            fast.put(Entry(s, it, (s, it)))
            full.put(Entry(s, it, (s, it)))
        elif op == "take":
            slot = full.slot(it)
            exact = (len(slot) == len(senders)
                     and all(s in slot and slot[s].iteration == it for s in senders))
            expected = [slot[s].handle for s in senders] if exact else None
            got = fast.take_exactly(it, senders)
            assert (None if got is None else [e.handle for e in got]) == expected
            if exact:
                assert [e.handle for e in full.take(it)] == expected     # take gives the same, sorted
        else:
            got = fast.drop_older(it)
            ref = [e for slot in full._slot for e in list(slot.values()) if e.iteration < it]
            for e in ref:
                del full._slot[e.iteration % slots][e.sender]
            full.size -= len(ref)
            assert [e.handle for e in got] == [e.handle for e in ref]
        assert sorted(e.handle for e in fast.entries()) == sorted(e.handle for e in full.entries())
        assert fast.size == full.size == len(fast.entries())


def test_take_exactly_refuses_a_slot_with_more_or_fewer():
    q = IterationSlots(2)
    q.put(Entry(1, 4, "a"))
    assert q.take_exactly(4, [1, 2]) is None and q.size == 1              # 2's is missing
    q.put(Entry(2, 6, "old"))                                              # same slot, other iteration
    assert q.take_exactly(4, [1, 2]) is None and q.size == 2
    q2 = IterationSlots(2)
    for s, h in ((2, "b"), (1, "a"), (3, "c")):
        q2.put(Entry(s, 4, h))
    assert q2.take_exactly(4, [1, 2]) is None                              # 3's is extra
    assert [e.handle for e in q2.take_exactly(4, [1, 2, 3])] == ["a", "b", "c"] and q2.size == 0


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_full_reduce_reuses_weights_equal_to_normalising_each_time(data):
    """Standard.plan with every sender's update takes its weights from a table computed once: bit for bit
    the weights of _normalised on that Reduce's terms (zero or tiny self-loops included)."""
    rank = data.draw(st.integers(0, 5))
    senders = data.draw(st.lists(st.integers(0, 5).filter(lambda s: s != rank), min_size=1, max_size=4,
                                 unique=True))
    weight = st.one_of(st.just(0.0), st.floats(1e-9, 10.0))
    w = {s: data.draw(weight) for s in senders}
    w[rank] = data.draw(weight)
    p = Standard(rank, w, slots=3)
    for k in range(3):
        for s in data.draw(st.permutations(senders)):
            p.on_update(Entry(s, k, (s, k)))
        terms = p.plan(k)
        raw = [(rank, k, SELF, w[rank])] + [(s, k, (s, k), w[s]) for s in sorted(senders)]
        assert terms == _normalised(raw)
        assert all(type(t) is Term for t in terms)
        p.set_floor(k + 1)


def test_take_if_is_can_take_then_take():
    a = TokenLedger(in_neighbors=[1, 2], out_neighbors=[1, 2], max_ig=2)
    b = TokenLedger(in_neighbors=[1, 2], out_neighbors=[1, 2], max_ig=2)
    rng = random.Random(3)
    for _ in range(200):
        j, n = rng.choice([1, 2]), rng.randrange(1, 3)
        if rng.random() < 0.5:
            c = rng.randrange(0, 8)
            a.on_grant(j, c)
            b.on_grant(j, c)
        ok = b.can_take(n)
        if ok:
            b.take(n)
        assert a.take_if(n) == ok and a.taken == b.taken


@pytest.mark.parametrize("got", [0.25, (0.25, 3.0), (0.25, None)])
def test_timing_backend_reads_compute_time_as_step_of_does(got):
    b = TimingBackend(0, lambda rank, it: got)
    seconds, factor = step_of(lambda rank, it: got, 0, 5)
    assert b.compute(5) == compute_record(seconds, factor) and b.duration == seconds


def test_a_wait_is_timed_from_its_first_wait_until_the_worker_acts():
    """The core repeats its Wait whenever a message arrives that does not satisfy it; the transport's
    timeout covers the whole wait (a rank waiting for a hung peer had its clock restarted by every
    unrelated message, so a rank further along timed out first and named the wrong ranks)."""
    from hopdec.transport.waiting import WaitClock
    now = [100.0]
    w = WaitClock(clock=lambda: now[0], wall=lambda: 5000.0 + now[0])
    assert w.left(4.0) == 4.0 and w.began == 5100.0
    now[0] += 3.0                           # a message arrived; the same wait goes on
    assert w.left(4.0) == 1.0 and w.began == 5100.0
    now[0] += 2.0
    assert w.left(4.0) == 0.0 and w.left(None) is None
    w.over()                                # the worker acted: its next wait is a new one
    assert w.left(4.0) == 4.0 and w.began == 5105.0


def test_the_loop_tells_the_transport_when_a_wait_is_over():
    """worker_loop calls ``io.wait_over()`` once after each run of Waits, before the next action, and never
    between two Waits of the same wait (a real core on a ring, its updates delivered late)."""
    from hopdec.hop.config import ProtocolConfig
    from hopdec.hop.worker import Worker, node_views
    from hopdec.runtime.hop_loop import worker_loop
    from hopdec.topology.generators import ring

    events = []

    class IO:
        def send_update(self, iteration, dests, fill, grants=None):
            events.append("send")

        def send_grants(self, grants):
            pass

        def payload(self, handle):
            return None

        def release(self, handles):
            pass

        def wait_over(self):
            events.append("over")

    class Backend:
        def write_params(self, out=None):
            return None

        def compute(self, iteration):
            return {"loss": None, "compute_s": 0.0}

        def reduce(self, pairs):
            pass

        def apply(self, iteration):
            pass

    views = node_views(ring(3))
    core = Worker(views[0], ProtocolConfig(iterations=3))
    others = [Worker(v, ProtocolConfig(iterations=3)) for v in views[1:]]
    loop = worker_loop(core, IO(), Backend())
    waits = 0
    for a in loop:                          # only Waits come out (step=False)
        events.append("wait")
        waits += 1
        if waits % 2 == 0:                  # every second Wait: the update of its iteration arrives
            for o in others:
                if o.rank in core.view.in_weights:
                    core.on_update(o.rank, core.iteration, 0)
            for j in core.view.out_neighbors:
                core.on_grant(j, core.iteration + 10)
    assert waits >= 4
    runs = "".join("w" if e == "wait" else "o" if e == "over" else "." for e in events)
    assert runs.count("wwo") == runs.count("o") >= 2, runs     # each wait of two Waits, then over once
    # every run of Waits ends in exactly one 'over', and no 'over' comes without a Wait before it
    for i, e in enumerate(events):
        if e == "over":
            assert events[i - 1] == "wait"
        if e == "wait" and i + 1 < len(events):
            assert events[i + 1] in ("wait", "over")
