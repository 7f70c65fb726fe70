"""Live progress: newline-terminated lines from rank 0 while a run trains (or a bar on a real terminal).

Open MPI forwards a rank's output line by line, so a bar redrawn with ``\\r`` shows nothing until exit.
Under a launcher (or whenever stderr is not a terminal) rank 0 prints one line every
``--progress-interval`` seconds instead::

    progress  12.0 s  iter 41..47 of 200 (slowest rank 3, fastest rank 0)  5.1 it/s  loss 0.412  gap 6 (bound 8)  ETA 31 s

How rank 0 learns where the others are, without stalling anyone: time is cut into a grid of
``interval`` seconds from the common start. A worker notes, at each iteration it finishes, which grid
points it has passed (it was in that iteration at those instants: exact, not a guess), and only when it
passed one sends rank 0 one tiny message (6 doubles, eager, ``Isend`` on a communicator of its own) --
one message per worker per interval. Rank 0 receives them (``Testsome`` on posted receives) when it
finishes an iteration and in its waits (:func:`hopdec.transport.waiting.add_idle_hook`), and prints the
line of a grid point once every worker has reported it: the iterations in it are the workers' iterations
*at the same instant*, so the gap it shows is a real gap, not an artefact of stale reports. A worker
silent for two intervals is named in a line of its own (``waiting for rank 3: in iteration >= 17 for
6 s``); when every rank is silent they wait on each other, and the line says so instead of naming rank 0.

:class:`GridSampler` (worker side) and :class:`ProgressBoard` (rank 0) are plain Python with the time
passed in, so a simulator drives them with virtual time (:class:`VirtualProgress`).
"""

import math
import sys
import time

import numpy as np

MSG = 6                      # doubles per message: kind, grid from, grid to, iteration, next iteration, loss
K_SAMPLE, K_DONE = 1.0, 2.0
TAG = 301


def line_mode(stream=None):
    """Progress as lines (under a launcher, or output not a terminal) rather than a redrawn bar."""
    from hopdec.launcher import under_launcher
    stream = stream or sys.stderr
    return under_launcher() or not getattr(stream, "isatty", lambda: False)()


class GridSampler:
    """One worker's side: which iteration it was in at each grid point ``t0 + g * dt``.

    Feed it :meth:`on_record` with each finished iteration's record (its ``iter``, ``loss``, and where it
    goes next) and the time it finished; it returns a message ``(g_from, g_to, iteration, next, loss)``
    when grid points ``g_from..g_to`` passed during that iteration, else None. A PS mini-batch ends at
    its record's ``t_released``: the server released the slowest's reply and the workers it let go on in
    one step, so the gap at any instant of the server's clock is within SSP's bound, while the replies'
    arrivals are not ordered (the slowest's can come after a released worker's next record began).
    """

    def __init__(self, t0, dt, iterations):
        self.t0, self.dt, self.n = t0, dt, iterations
        self.g = 0                       # grid points 1..g are reported (0 is the start: everyone at 0)
        self.losses = []

    def on_record(self, rec, now):
        if rec.get("loss") is not None:
            self.losses.append(rec["loss"])
        end = rec.get("t_released")              # PS: the server's release, on the grid's clock (rank 0's)
        g_now = int(((now if end is None else end) - self.t0) / self.dt)
        if g_now <= self.g:
            return None
        nxt = rec["jump"][1] if "jump" in rec else rec["iter"] + 1
        loss = float(np.mean(self.losses)) if self.losses else math.nan
        self.losses = []
        msg = (self.g + 1, g_now, rec["iter"], nxt if self.n is None else min(nxt, self.n), loss)
        self.g = g_now
        return msg


class ProgressBoard:
    """Rank 0's side: every worker's iteration at every grid point it reported; makes the lines.

    ``bound``: the gap bound to print beside the gap; ``unit``: ``s`` or ``virtual s``; ``extra()``: a
    callable giving a few more words (the PS server's version and drops).
    """

    def __init__(self, workers, iterations, dt, bound=None, unit="s", extra=None, what="iter"):
        self.workers = tuple(workers)
        self.n, self.dt, self.bound, self.unit, self.extra, self.what = iterations, dt, bound, unit, extra, what
        self.at = {w: [0] for w in self.workers}      # at[w][g]: iteration at grid point g
        self.next = {w: 0 for w in self.workers}      # the iteration it went on to after its last report
        self.loss = {w: math.nan for w in self.workers}
        self.done = set()
        self.printed = 0                              # last grid point printed
        self.silent_note = 0

    def add(self, w, g_from, g_to, iteration, nxt, loss):
        at = self.at[w]
        while len(at) < g_from:                       # a gap in its reports: it stayed where it went
            at.append(self.next[w])
        while len(at) <= g_to:
            at.append(int(iteration))
        self.next[w] = int(nxt)
        if not math.isnan(loss):
            self.loss[w] = loss

    def finish(self, w, last):
        self.done.add(w)
        self.next[w] = int(last)

    def ending(self):
        """How the finished workers ended: ``finished``, or, when none reached the last iteration (a clean
        stop, or a loop that ended before the ``steps`` it announced), ``ended early (before iter 5000)``
        (the stop's own line says where)."""
        last = [self.next[w] for w in self.done]
        if self.n is None or not last or max(last) >= self.n - 1:
            return "finished"
        return f"ended early (before {self.what} {self.n})"

    def _iter_at(self, w, g):
        at = self.at[w]
        if g < len(at):
            return at[g]
        return self.next[w] if w in self.done else None

    def complete(self):
        """The last grid point every worker has reported (finished workers count for any)."""
        return min(len(self.at[w]) - 1 if w not in self.done else math.inf for w in self.workers)

    def lines(self, now_g):
        """The lines due: one per newly complete grid point (at most the latest one), plus a note on
        silent workers once the wait for them passes two intervals (``now_g``: the current grid point)."""
        out = []
        g = self.complete()
        if g == math.inf:
            g = max(len(a) - 1 for a in self.at.values())
        if g > self.printed:
            out.append(self.line(int(g)))
            self.printed = int(g)
            self.silent_note = 0
        elif now_g - self.printed >= 2 and now_g > self.silent_note:
            late = [w for w in self.workers if w not in self.done and len(self.at[w]) - 1 <= self.printed]
            running = [w for w in self.workers if w not in self.done]
            if len(late) > 1 and len(late) == len(running):
                # every rank is silent: they wait on each other (one of them stopped, hung or in a long
                # step); naming the first would blame rank 0, which is as stuck as the rest
                since = max(len(self.at[w]) - 1 for w in late) * self.dt
                lo, hi = min(self.next[w] for w in late), max(self.next[w] for w in late)
                its = f"{lo}" if lo == hi else f"{lo}..{hi}"
                out.append(f"progress  {now_g * self.dt:.1f} {self.unit}  every rank silent since {since:.1f} "
                           f"{self.unit}, in {self.what} >= {its}: they wait on one another (one may be stopped, "
                           f"hung or in a long step)")
                self.silent_note = now_g + 1
            elif late:
                w = late[0]
                since = (len(self.at[w]) - 1) * self.dt
                out.append(f"progress  {now_g * self.dt:.1f} {self.unit}  waiting for rank {w}: in "
                           f"{self.what} >= {self.next[w]} since {since:.1f} {self.unit}"
                           + (f" (and {len(late) - 1} more)" if len(late) > 1 else ""))
                self.silent_note = now_g + 1
        return out

    def line(self, g):
        its = {w: self._iter_at(w, g) for w in self.workers}
        its = {w: k for w, k in its.items() if k is not None}
        slow = min(its, key=lambda w: (its[w], w))
        fast = max(its, key=lambda w: (its[w], -w))
        prev = max(self.printed, 0)
        rates = [(its[w] - (self._iter_at(w, prev) or 0)) / ((g - prev) * self.dt) for w in its] if g > prev \
            else []
        rate = float(np.mean(rates)) if rates else math.nan
        losses = [v for w, v in self.loss.items() if not math.isnan(v)]
        gap = its[fast] - its[slow]
        of = "" if self.n is None else f" of {self.n}"          # None: a loop whose length nobody knows
        parts = [f"progress  {g * self.dt:.1f} {self.unit}",
                 f"{self.what} {its[slow]}..{its[fast]}{of} (slowest rank {slow}, fastest rank {fast})"
                 if len(its) > 1 and gap else f"{self.what} {its[slow]}{of}" + (" (every worker)" if len(its) > 1
                                                                                 else ""),
                 f"{rate:.3g} {'rounds' if self.what == 'round' else 'it'}/s" if not math.isnan(rate) else "",
                 f"loss {np.mean(losses):.4g}" if losses else "",
                 (f"gap {gap}" + (f" (bound {self.bound:g})" if self.bound is not None
                                  and math.isfinite(self.bound) else "")) if len(its) > 1 else "",
                 f"ETA {(self.n - 1 - its[slow]) / rate:.0f} {self.unit}" if rate and rate > 0
                 and not math.isnan(rate) and self.n is not None and its[slow] < self.n - 1 else "",
                 self.extra() if self.extra else ""]
        if len(self.done) == len(self.workers):
            parts.append(f"all {self.ending()}")
        return "  ".join(p for p in parts if p)


class LiveProgress:
    """Live progress of an MPI run: rank 0 prints, every worker reports (see the module docstring).

    ``comm``: a communicator of its own (``Dup``); ``workers``: the ranks that train (rank 0 may be a
    server); ``board_extra``: rank 0's extra words. A terminal without a launcher gets a tqdm bar instead
    (one process then: nobody to hear from).
    """

    def __init__(self, comm, workers, iterations, interval, t0, bound=None, stream=None, board_extra=None,
                 timeout=120.0, bar=None, what="iter"):
        self.comm, self.rank = comm, comm.Get_rank()
        self.workers, self.n, self.dt, self.t0 = tuple(workers), iterations, interval, t0
        self.timeout = timeout
        self.stream = stream or sys.stderr
        self.bar = None
        self.sampler = GridSampler(t0, interval, iterations) if self.rank in self.workers else None
        self.board = None
        self._ring = [[np.zeros(MSG), None] for _ in range(4)]     # a few sends in flight, never a wait
        self._send_req = None
        self._finished_sent = False
        if self.rank == 0:
            bar = (not line_mode(self.stream)) if bar is None else bar
            if bar and comm.Get_size() == 1:
                from tqdm import tqdm
                self.bar = tqdm(total=iterations, desc="hopdec", file=self.stream, mininterval=0.5, leave=False)
            self.board = ProgressBoard(self.workers, iterations, interval, bound=bound, extra=board_extra,
                                       what=what)
            self.remote = [w for w in self.workers if w != 0]
            self.bufs = {w: np.zeros(MSG) for w in self.remote}
            self.reqs = [comm.Irecv(self.bufs[w], source=w, tag=TAG) for w in self.remote]
            self.pending_done = set(self.remote)

    # ---- every worker ----
    def on_record(self, rec, now=None):
        now = time.time() if now is None else now
        if self.bar is not None:
            self.bar.n = rec["iter"] + 1 if self.n is None else min(self.n, rec["iter"] + 1)
            if rec.get("loss") is not None:
                self.bar.set_postfix(loss=f"{rec['loss']:.4g}", refresh=False)
            self.bar.refresh() if self.n is not None and self.bar.n >= self.n else self.bar.update(0)
            return
        if self.sampler is None:
            return
        msg = self.sampler.on_record(rec, now)
        if msg is None:
            return
        if self.rank == 0:
            self.board.add(0, *msg)
            self.poll(now)
        else:
            self._send((K_SAMPLE,) + msg)

    def _send(self, values):
        for slot in self._ring:
            if slot[1] is None or slot[1].Test():
                slot[0][:] = values
                slot[1] = self._send_req = self.comm.Isend(slot[0], dest=0, tag=TAG)
                return
        # all in flight (rank 0 has not received for a while): skip; rank 0 fills the hole from the next

    def _wait_sent(self, what):
        from mpi4py import MPI
        from hopdec.transport.waiting import poll_until
        reqs = [s[1] for s in self._ring if s[1] is not None]
        if reqs:
            poll_until(lambda: MPI.Request.Testall(reqs), self.timeout,
                       f"rank {self.rank}: {what} did not reach rank 0 in {self.timeout:.0f} s")

    def finished(self, last_iteration):
        """This worker trained its last iteration (call before the transport's shutdown)."""
        if self.sampler is None or self._finished_sent:
            return
        self._finished_sent = True
        if self.rank == 0:
            self.board.finish(0, last_iteration)
            return
        self._wait_sent("its progress reports")     # eager: long gone; keeps the DONE message last
        self._send((K_DONE, 0, 0, last_iteration, last_iteration, math.nan))

    # ---- rank 0 ----
    def poll(self, now=None):
        """Take what arrived; print the lines that are due. Quick; never waits."""
        if self.board is None or self.bar is not None:
            return
        from mpi4py import MPI
        while self.remote:
            done = MPI.Request.Testsome(self.reqs)
            if not done:
                break
            for i in done:
                w = self.remote[i]
                kind, g_from, g_to, it, nxt, loss = self.bufs[w]
                if kind == K_DONE:
                    self.board.finish(w, int(it))
                    self.pending_done.discard(w)
                    self.reqs[i] = MPI.REQUEST_NULL
                else:
                    self.board.add(w, int(g_from), int(g_to), int(it), int(nxt), float(loss))
                    self.reqs[i] = self.comm.Irecv(self.bufs[w], source=w, tag=TAG)
        now = time.time() if now is None else now
        for line in self.board.lines(int((now - self.t0) / self.dt)):
            print(line, file=self.stream, flush=True)

    def close(self):
        """After training (and the transport's shutdown): rank 0 takes every worker's last report, so no
        message is left unreceived; the others make sure theirs left."""
        from hopdec.transport.waiting import poll_until
        if self.bar is not None:
            self.bar.close()
            return
        if self.rank == 0 and self.board is not None:
            def all_done():
                self.poll()
                return not self.pending_done
            poll_until(all_done, self.timeout, f"rank 0: no final progress report from rank(s) "
                                               f"{sorted(self.pending_done)} in {self.timeout:.0f} s")
            print(f"progress  {time.time() - self.t0:.1f} s  all {len(self.workers)} workers {self.board.ending()}",
                  file=self.stream, flush=True)
        elif self.sampler is not None:
            self._wait_sent("its last progress report")


class VirtualProgress:
    """Progress lines for a run in virtual time, in one process (a simulator).

    Call :meth:`on_record` with each worker's record and the virtual time it finished, :meth:`finish`
    when a worker is done, and :meth:`tick` now and then: lines are printed at most every
    ``wall_interval`` wall seconds, each for the latest complete grid point of ``interval`` virtual
    seconds, labelled ``virtual s``.
    """

    def __init__(self, workers, iterations, interval, bound=None, stream=None, wall_interval=2.0,
                 extra=None, clock=time.monotonic):
        self.samplers = {w: GridSampler(0.0, interval, iterations) for w in workers}
        self.board = ProgressBoard(workers, iterations, interval, bound=bound, unit="virtual s", extra=extra)
        self.stream = stream or sys.stderr
        self.wall_interval, self.clock = wall_interval, clock
        self._next = clock()
        self.now = 0.0

    def on_record(self, w, rec, now):
        self.now = max(self.now, now)
        msg = self.samplers[w].on_record(rec, now)
        if msg is not None:
            self.board.add(w, *msg)

    def finish(self, w, last):
        self.board.finish(w, last)

    def tick(self, force=False):
        if not force and self.clock() < self._next:
            return []
        self._next = self.clock() + self.wall_interval
        out = self.board.lines(int(self.now / self.board.dt))
        for line in out:
            print(line, file=self.stream, flush=True)
        return out
