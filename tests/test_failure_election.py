"""Who reports a failure that several ranks notice (:class:`hopdec.runtime.failures.FailureChannel`),
in one process over an in-memory stand-in for MPI's point-to-point messages."""

import threading
import time

import numpy as np

from hopdec.runtime import failures as F


class _Net:
    def __init__(self, size):
        self.size, self.queues, self.lock = size, {r: [] for r in range(size)}, threading.Lock()


class _Req:
    def __init__(self, net, rank, buf):
        self.net, self.rank, self.buf = net, rank, buf

    def Test(self):
        with self.net.lock:
            q = self.net.queues[self.rank]
            if not q:
                return False
            self.buf[:] = q.pop(0)
            return True


class _Comm:
    def __init__(self, net, rank):
        self.net, self.rank = net, rank

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.net.size

    def Irecv(self, buf, source, tag):
        return _Req(self.net, self.rank, buf)

    def Isend(self, buf, dest, tag):
        with self.net.lock:
            self.net.queues[dest].append(np.array(buf))
        return None


def test_a_rank_whose_failure_surfaces_after_another_rank_reported_stays_silent(monkeypatch):
    """Two workers time out waiting for a stopped server, 0.3 s apart on a loaded machine; the later one
    had started waiting earlier. The first heard nobody and reported; the later one must not report too
    (it did: two lines)."""
    monkeypatch.setattr(F, "GRACE_S", 0.02)
    monkeypatch.setattr(F, "PATIENCE_S", 0.05)
    net = _Net(3)
    first, later = F.FailureChannel(_Comm(net, 1)), F.FailureChannel(_Comm(net, 2))
    assert first.elect(1, since=10.0, on=(0,))
    assert not later.elect(1, since=9.0, on=(0,))


def _elect_together(net, ranks, priority, delay=None, on=None):
    """Each rank of ``ranks`` elects in its own thread (``delay[r]`` s after the others start), having
    waited for ``on[r]`` (default: rank 0)."""
    chans = {r: F.FailureChannel(_Comm(net, r)) for r in ranks}
    results, barrier = {}, threading.Barrier(len(ranks))

    def run(r):
        barrier.wait()
        if delay and r in delay:
            threading.Event().wait(delay[r])
        results[r] = chans[r].elect(priority[r], since=5.0 + r, on=(on or {}).get(r, (0,)))
    threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in ranks if results[r]]


def test_ranks_that_notice_together_elect_exactly_one(monkeypatch):
    monkeypatch.setattr(F, "GRACE_S", 0.2)
    monkeypatch.setattr(F, "PATIENCE_S", 0.4)
    for _ in range(3):
        assert len(_elect_together(_Net(4), (1, 2, 3), {1: 1, 2: 1, 3: 1})) == 1


def test_an_exception_noticed_within_the_grace_beats_an_earlier_timeout(monkeypatch):
    """Rank 1 times out first; rank 2's exception surfaces 50 ms later, while rank 1 still listens:
    the exception's cause is the one line."""
    monkeypatch.setattr(F, "GRACE_S", 0.3)
    monkeypatch.setattr(F, "PATIENCE_S", 0.6)
    assert _elect_together(_Net(3), (1, 2), {1: 1, 2: 0}, delay={2: 0.05}) == [2]


def test_a_neighbour_of_the_hung_ranks_waiters_defers_to_them_when_they_time_out_late(monkeypatch):
    """A ring of 4 with rank 2 hung: ranks 1 and 3 wait for it, rank 0 waits for them. On a loaded
    machine rank 1 was descheduled between its send and its wait, so rank 0 timed out first, heard
    nobody within the grace and named ranks 1 and 3 (a CI failure). It now keeps listening for the ranks
    it waited for, and the line comes from one that names the hung rank."""
    monkeypatch.setattr(F, "GRACE_S", 0.1)
    monkeypatch.setattr(F, "PATIENCE_S", 1.0)
    for _ in range(2):
        chosen = _elect_together(_Net(4), (0, 1, 3), {0: 1, 1: 1, 3: 1}, delay={1: 0.3, 3: 0.35},
                                 on={0: (1, 3), 1: (2,), 3: (2,)})
        assert chosen in ([1], [3]), chosen


def test_a_timeout_whose_waited_for_rank_never_announces_still_reports_within_the_patience(monkeypatch):
    monkeypatch.setattr(F, "GRACE_S", 0.05)
    monkeypatch.setattr(F, "PATIENCE_S", 0.3)
    t0 = time.monotonic()
    assert F.FailureChannel(_Comm(_Net(3), 1)).elect(1, since=1.0, on=(2,))
    assert 0.3 <= time.monotonic() - t0 < 1.0


def test_a_rank_not_chosen_reports_itself_when_the_chosen_one_never_claims(monkeypatch):
    """The chosen rank was killed before it could report: one line is still printed."""
    monkeypatch.setattr(F, "GRACE_S", 0.05)
    monkeypatch.setattr(F, "PATIENCE_S", 0.2)
    net = _Net(3)
    net.queues[2].append(np.array([0, 0, 1, 0, 0] + [0] * F.MAX_ON))    # rank 1's exception, then nothing
    assert F.FailureChannel(_Comm(net, 2)).elect(1, since=1.0)


class _SlowNet(_Net):
    """Every message becomes visible ``latency`` s after it was sent, and its send completes then: ranks that
    never exchanged a message connect first (Open MPI's TCP transport), which took longer than the grace on a
    loaded machine. ``never``: ranks whose sends to them never complete (stopped, with no connection yet)."""

    def __init__(self, size, latency, never=()):
        super().__init__(size)
        self.latency, self.never = latency, set(never)


class _SlowReq(_Req):
    def Test(self):
        with self.net.lock:
            q = self.net.queues[self.rank]
            if not q or q[0][0] > time.monotonic():
                return False
            self.buf[:] = q.pop(0)[1]
            return True


class _SlowSend:
    def __init__(self, at):
        self.at = at

    def Test(self):
        return time.monotonic() >= self.at


class _SlowComm(_Comm):
    def Irecv(self, buf, source, tag):
        return _SlowReq(self.net, self.rank, buf)

    def Isend(self, buf, dest, tag):
        at = time.monotonic() + self.net.latency
        with self.net.lock:
            self.net.queues[dest].append((at, np.array(buf)))
        return _SlowSend(float("inf") if dest in self.net.never else at)


def test_ranks_whose_notices_arrive_after_the_grace_still_elect_exactly_one(monkeypatch):
    """The workers of a parameter server never exchanged a message; when the server was declared dead all
    three noticed at once, their notices took longer than the grace to arrive (connections being set up on a
    loaded machine), and each, having heard nobody, reported: two or three lines (a CI failure). The one a
    notice chooses now waits until its notices have left, listens a moment more and chooses again."""
    monkeypatch.setattr(F, "GRACE_S", 0.1)
    monkeypatch.setattr(F, "PATIENCE_S", 0.2)
    monkeypatch.setattr(F, "SENT_S", 1.0)
    monkeypatch.setattr(F, "SETTLE_S", 0.05)
    net = _SlowNet(4, 0.3, never=(0,))         # rank 0: the stopped server
    chans = {r: F.FailureChannel(_SlowComm(net, r)) for r in (1, 2, 3)}
    results, barrier = {}, threading.Barrier(3)

    def run(r):
        barrier.wait()
        results[r] = chans[r].elect(0, since=5.0 + r)
    threads = [threading.Thread(target=run, args=(r,)) for r in chans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r for r in chans if results[r]] == [1]


def test_a_notice_that_never_leaves_delays_the_report_by_a_bounded_time(monkeypatch):
    """Sends to a stopped rank with no connection never complete: the chosen rank still reports, once
    SENT_S has passed."""
    monkeypatch.setattr(F, "GRACE_S", 0.05)
    monkeypatch.setattr(F, "SENT_S", 0.3)
    monkeypatch.setattr(F, "SETTLE_S", 0.05)
    t0 = time.monotonic()
    assert F.FailureChannel(_SlowComm(_SlowNet(3, 0.01, never=(2,)), 1)).elect(0, since=1.0)
    assert 0.35 <= time.monotonic() - t0 < 1.0
