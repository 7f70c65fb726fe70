"""How a run of :class:`hopdec.optim.HopOptimizer` ends when the ranks take different numbers of steps.

A user's loop decides when a rank is done (its shard ran out, a condition held); nobody knows a number of
steps up front. Done ranks must not leave: the others still need their updates (Recv(k) waits for every
in-neighbour's iteration-k parameters) and their tokens. So (``finish()``):

1. **Done.** The rank tells every other rank (a small message on a communicator of its own).
2. **Serve.** Until it has heard that every rank is done, it keeps carrying out the protocol without a
   gradient: Recv + Reduce with its neighbours, no optimizer step, Send -- it mixes, and its neighbours
   can go on (it keeps pace with them; tokens bound how far it runs ahead, Hop sec. 4.2). While it waits
   for a reason to advance it releases the updates its core let go of (late ones, with staleness): held
   until its next step, which never comes, they would fill a sender's receive slots, and the updates that
   show the sender is ahead could not arrive.
3. **Agree.** Once every rank is done, each one stops advancing and the ranks exchange their positions
   (the last iteration each entered; one nonblocking allgather); the run ends at ``P = max``.
4. **Catch up.** A rank behind P serves on up to P: iterations < P complete (Reduce, no step), and it
   enters P and sends its parameters. Every rank now holds its x_P, the end is a consistent cut (the
   same as ``hopdec train``'s resume cut, :meth:`hopdec.hop.worker.Worker.resume_at`), and the transport
   shuts down (draining the last updates nobody reduces).

Why this always ends (as the stop agreement of :mod:`hopdec.runtime.interrupt`): the rank furthest
behind has every update it needs (its in-neighbours are at least where it is and sent on entering) and the
tokens (its out-neighbours granted up to their position + max_ig); so it advances, until all are at P. With
the serial graph a rank sends update k only after ComputeGradient(k), where a done rank pauses: it serves
also when a neighbour is level with it (a neighbour in Recv(k) waits for that update). Done ranks then keep
pace one step ahead along the graph, so while the last rank trains, one downstream of it may run as far ahead
as the iteration-gap bound allows (:func:`hopdec.topology.bounds.max_gap_bound`; tokens, Hop sec. 4.2), and
ranks that finish together may each serve once more before they hear of each other: the common stop is at
most the last rank's steps + gap bound + 1 (iterations of mixing without a gradient).

While a rank waits in ``consensus_model()``, it advances without a gradient only when a neighbour is
known to be ahead of it (:func:`neighbour_ahead`): that neighbour may be unable to reach its own call
without this rank's next update (after iteration skipping, or with unequal step counts). With every rank at
the same iteration, nobody is ahead and nothing changes: the call is deterministic. With the serial graph
a neighbour level with it may already have sent update k and wait for this rank's in Recv(k) -- or may be
paused before ComputeGradient(k) too (in the same call: then nothing must change). An update in hand
tells the first case apart, but an out-neighbour with no edge back sends none: so a rank paused there
says so to its out-neighbours (PAUSED k), and one that has sent update k answers (NEED k), which lets it
serve iteration k. Neither is sent once the sender said it is done (its DONE message counts them, so the
channel's close receives every one: no message is left on a freed communicator).
"""

import time

import numpy as np

from hopdec.transport.waiting import poll_until

TAG_DONE = 411
TAG_PAUSED = 412        # "I am paused before ComputeGradient(k) in a consensus call" (serial graph)
TAG_NEED = 413          # "I have sent update k and wait for yours": serve iteration k
TAG_LEFT = 414          # "this process ends after N consensus calls" (LeavingNotes)


def neighbour_ahead(core, level=False):
    """True when some neighbour is known to be at a later iteration than ``core`` (and may wait for it):
    an in-neighbour's update of a later iteration is held, an out-neighbour's tokens put it ahead, or
    (notify-ack) an out-neighbour has consumed this worker's current update. ``level``: a neighbour at the
    *same* iteration counts too -- with the serial graph (Hop sec. 3.2) a worker sends update k only after its
    ComputeGradient(k), where a done rank pauses, so a neighbour in Recv(k) waits for it. Reads the core,
    decides nothing about the protocol."""
    k = core.iteration - (1 if level else 0)
    if any(e.iteration > k for e in core.policy.queue.entries()):
        return True
    led = core.ledger
    if led is not None and any(led.lead_of(j) > (-1 if level else 0) for j in core.view.out_neighbors):
        return True
    acks = core.acks
    return acks is not None and any(c > k for c in acks.acked.values())


class PausedNotes:
    """The serial graph's notes in consensus waits (module doc): what one rank heard and said, no I/O (the
    notes travel on :class:`EndChannel`)."""

    def __init__(self):
        self.paused = {}                    # in-neighbour -> the iteration it said it is paused at
        self.needed = -1                    # the latest iteration an out-neighbour asked this rank to serve
        self.announced = None               # the iteration this rank said it is paused at

    def heard(self, paused, needs):
        """Take :meth:`EndChannel.take_notes`' ``(paused, needs)``."""
        for j, k in paused.items():
            self.paused[j] = max(self.paused.get(j, -1), k)
        for k in needs.values():
            self.needed = max(self.needed, k)

    def answers(self, last_sent):
        """``[(in-neighbour, k)]`` to send NEED k to: it is paused at k and this rank has sent update k (it
        waits, or will, for that neighbour's); each is answered once."""
        due = [(j, k) for j, k in self.paused.items() if k <= last_sent]
        for j, _ in due:
            del self.paused[j]
        return due

    def asked(self, k):
        """Whether an out-neighbour asked this rank, paused at k, to serve k."""
        return self.needed >= k

    def announce(self, k):
        """Whether to say PAUSED k now (once per iteration)."""
        if self.announced == k:
            return False
        self.announced = k
        return True


class EndChannel:
    """Steps 1 and 3 above over a duplicated communicator: ``announce_done()``, ``all_done()``,
    ``agree(position, poll)``. A DONE message carries how many ``consensus_model()`` calls the rank made,
    so a rank waiting in one that another rank will never make says so at once."""

    def __init__(self, comm, timeout, fault_tolerant=False):
        self.comm = comm.Dup()
        self.timeout = timeout
        self.fault_tolerant = fault_tolerant
        self.failed = False                 # a peer's failure seen here (fault tolerant): the owner heals
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.peers = [r for r in range(self.size) if r != self.rank]
        self.bufs = {r: np.zeros(2, dtype=np.int64) for r in self.peers}
        self.reqs = [self.comm.Irecv(self.bufs[r], source=r, tag=TAG_DONE) for r in self.peers]
        self.heard = {}                     # rank -> its consensus calls, once it said it is done
        self.sends = []
        self.done = False
        self.notes_to = {}                  # rank -> PAUSED/NEED notes sent to it (said in DONE)
        self.notes_from = {}                # rank -> notes received from it
        self.note_sends = []

    def _test(self):
        from mpi4py import MPI
        if len(self.heard) < len(self.peers) and not self.failed:
            try:
                got = MPI.Request.Testsome(self.reqs)
            except MPI.Exception as err:
                # a receive from a rank that died: it may be no neighbour of this one, so the end channel
                # can be the first to see it (a rank waiting in finish()); the owner heals, and a new
                # channel among the survivors replaces this one
                from hopdec.transport.mpi import is_peer_failure
                if not self.fault_tolerant or not is_peer_failure(err, self.comm):
                    raise
                self.failed = True
                return self.heard
            for i in got or ():
                self.heard[self.peers[i]] = int(self.bufs[self.peers[i]][0])      # ([1]: its notes to this rank)
        return self.heard

    def announce_done(self, consensus_calls):
        notes = {r: np.array([consensus_calls, self.notes_to.get(r, 0)], dtype=np.int64) for r in self.peers}
        self.sends = [(notes[r], self.comm.Isend(notes[r], dest=r, tag=TAG_DONE)) for r in self.peers]
        self.done = True

    def note(self, dest, tag, iteration):
        """Send ``dest`` a PAUSED or NEED note of ``iteration`` (nothing once this rank said it is done)."""
        if self.done or self.failed:
            return
        buf = np.array([iteration], dtype=np.int64)
        self.note_sends = [s for s in self.note_sends if not s[1].Test()]
        self.note_sends.append((buf, self.comm.Isend(buf, dest=dest, tag=tag)))
        self.notes_to[dest] = self.notes_to.get(dest, 0) + 1

    def take_notes(self):
        """The notes that arrived: ``({rank: latest PAUSED iteration}, {rank: latest NEED iteration})``."""
        from mpi4py import MPI
        got = ({}, {})
        if self.failed:
            return got
        status = MPI.Status()
        buf = np.zeros(1, dtype=np.int64)
        for tag, into in ((TAG_PAUSED, got[0]), (TAG_NEED, got[1])):
            while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=tag, status=status):
                src = status.Get_source()
                self.comm.Recv(buf, source=src, tag=tag)
                self.notes_from[src] = self.notes_from.get(src, 0) + 1
                into[src] = max(into.get(src, -1), int(buf[0]))
        return got

    def finished_ranks(self):
        """The other ranks that said they are done, with their consensus calls ``{rank: calls}``."""
        return self._test()

    def all_done(self):
        return self.done and len(self._test()) == len(self.peers)

    def agree(self, position, poll, abandon=None):
        """Every rank's position (collective, after :meth:`all_done`); ``poll()`` runs while waiting
        (the transport's messages keep flowing). Returns the largest, or None once ``abandon()`` is true
        (the owner healed meanwhile: this channel's agreement is void)."""
        mine = np.array([position], dtype=np.int64)
        everyone = np.zeros(self.size, dtype=np.int64)
        req = self.comm.Iallgather(mine, everyone)
        void = []

        def done():
            poll()
            if abandon is not None and abandon():
                void.append(True)
                return True
            return req.Test()
        poll_until(done, self.timeout, lambda: f"rank {self.rank}: finish(): not every rank said where it "
                                               f"is within {self.timeout:.0f} s; a peer may have died or hung")
        return None if void else int(everyone.max())

    def close(self):
        from mpi4py import MPI
        poll_until(lambda: MPI.Request.Testall([r for _, r in self.sends + self.note_sends]), self.timeout,
                   f"rank {self.rank}: finish(): a done message was not received for {self.timeout:.0f} s")
        MPI.Request.Waitall(self.reqs)

        def every_note_in():                # (sent before the DONE that counts them: on their way)
            self.take_notes()
            return all(self.notes_from.get(r, 0) >= int(self.bufs[r][1]) for r in self.peers)
        poll_until(every_note_in, self.timeout,
                   f"rank {self.rank}: finish(): a peer's notes were not received for {self.timeout:.0f} s")
        self.comm.Free()


class LeavingNotes:
    """After ``finish()``: the number of consensus calls each rank made in all, told by the rank as its
    process ends -- so a rank that waits in a consensus call another never makes learns it at once instead
    of at the peer timeout (before ``finish()`` the DONE message carries the count: :meth:`EndChannel.
    finished_ranks`). One int64 per other rank on the consensus communicator, at interpreter exit."""

    LINGER_S = 2.0
    """How long a leaving rank waits for its notes to go out (8 bytes each: at once, unless a peer is gone)."""

    def __init__(self, comm):
        self.comm = comm
        self.calls = 0                      # this rank's consensus calls so far (the optimizer counts them here)
        self.left = {}                      # rank -> its calls in all, as it left

    def say(self):
        """Tell every other rank how many calls this rank made in all (its process ends). Never raises."""
        from mpi4py import MPI
        try:
            if MPI.Is_finalized():
                return
            me, n = self.comm.Get_rank(), self.comm.Get_size()
            buf = np.array([self.calls], dtype=np.int64)
            reqs = [self.comm.Isend(buf, dest=r, tag=TAG_LEFT) for r in range(n) if r != me]
            deadline = time.monotonic() + self.LINGER_S
            while not MPI.Request.Testall(reqs) and time.monotonic() < deadline:
                time.sleep(1e-3)
        except Exception:                   # (leaving must not fail: the job ends either way)
            pass

    def heard(self):
        """The ranks that have left so far: ``{rank: calls in all}`` (takes the notes that arrived)."""
        from mpi4py import MPI
        st = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_LEFT, status=st):
            buf = np.empty(1, dtype=np.int64)
            self.comm.Recv(buf, source=st.Get_source(), tag=TAG_LEFT)
            self.left[st.Get_source()] = int(buf[0])
        return self.left
