"""The Hop protocol core: one worker as a state machine that consumes events and emits actions.

No MPI, no torch, no clocks (sans-I/O, like h11; see :mod:`hopdec.core`). A driver
(:mod:`hopdec.runtime.hop_loop`) asks :meth:`Worker.next_action` what to do -- send parameters, grant tokens,
compute, reduce, apply (:mod:`hopdec.hop.actions`) -- and feeds back what arrived (:meth:`Worker.on_update`,
:meth:`Worker.on_grant`). When the worker cannot go on it answers :class:`~hopdec.core.Wait`; the driver
then blocks on its transport (MPI) or lets another worker run (in-process). Every driver runs this code.

One iteration k (Hop Figure 7, parallel computation graph, sec. 3.2):
``Enter(k)`` (inserting a token for every in-neighbour: its grants) -> ``SendParams(k)`` ->
``ComputeGradient(k)`` -> Recv(k) (``Wait`` until the policy's plan is ready) -> ``Reduce(k)`` ->
``ApplyGradient(k)`` -> take a token from every out-neighbour (``Wait`` while one is missing) ->
``Enter(k+1)``. The serial graph computes and applies first, then sends and reduces. Iteration
skipping (sec. 5) may turn the token step into ``Jump``. Notify-ack (sec. 3.3) has no tokens: Send(k)
waits for every out-neighbour's ACK of update k - 1, and ``SendAcks`` follows every Reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union, cast

from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait
from hopdec.hop.actions import Enter, Jump, Reduce, ReleaseUpdates, SendAcks, SendParams
from hopdec.hop.config import effective_backup
from hopdec.hop.protocols import PROTOCOLS
from hopdec.hop.receive import damped, make_policy
from hopdec.hop.update_queue import Entry

if TYPE_CHECKING:
    from hopdec.hop.receive import Stale, Standard
    from hopdec.hop.token_queue import AckLedger, TokenLedger


@dataclass(frozen=True)
class NodeView:
    """What one worker knows of the graph: plain data made from the topology by the driver."""

    rank: int
    in_weights: dict                 # sender -> W[sender, rank], the self-loop included
    out_neighbors: tuple             # receivers, self excluded
    backup_workers: Optional[int] = None  # per-node override (topology attribute ``backup_workers``)
    ahead_bound: Optional[int] = 1   # queue-only: how far an in-neighbour may be ahead (Theorem 1);
                                     # None: not computed (node_views(ahead=False))
    steps: Optional[tuple] = None    # time-varying topology: ((in_weights, out_neighbors) of step m, ...);
                                     # then in_weights / out_neighbors are the union's (hopdec.hop.time_varying)

    @property
    def in_neighbors(self) -> tuple:
        return tuple(sorted(s for s in self.in_weights if s != self.rank))

    @property
    def period(self) -> int:
        return len(self.steps) if self.steps else 1

    def in_weights_at(self, k: int) -> dict:
        """Sender -> weight of Recv(k)/Reduce(k) (the step k mod P of a schedule; always ``in_weights``
        on a static graph)."""
        return self.steps[k % len(self.steps)][0] if self.steps else self.in_weights

    def out_at(self, k: int) -> tuple:
        """The receivers of Send(k)."""
        return self.steps[k % len(self.steps)][1] if self.steps else self.out_neighbors


class Worker:
    """One worker's protocol state. Drive it with :meth:`next_action`, feed it with ``on_*``."""

    ledger: Optional[TokenLedger]
    acks: Optional[AckLedger]
    policy: Union[Standard, Stale]

    def __init__(self, view: NodeView, cfg: Any) -> None:
        self.view = view
        self.cfg = cfg
        self.rank: int = view.rank
        backup = effective_backup(cfg, view)
        # the protocol's gap control (hopdec.hop.protocols): token queues, ACKs, or update queues alone
        self.ledger, self.acks, max_ig, slots = PROTOCOLS[cfg.protocol].ledgers(view, cfg)
        self.max_ig: Optional[int] = max_ig
        self.slots: int = slots
        self.policy = make_policy(self.rank, view.in_weights, slots, backup=backup,
                                  staleness=cfg.staleness, weighted=cfg.stale_reduce == "weighted",
                                  steps=tuple(w for w, _ in view.steps) if view.steps else None)
        self.iteration: int = 0
        self.jumps: list[tuple[int, int]] = []    # (from, to)
        self.sends_skipped: int = 0
        self._pending_release: list[Entry] = []
        self._catch_up: Optional[SendParams] = None
        self._last_sent: int = -1
        self.budget: int = cfg.iterations  # the run ends after iteration budget - 1 (see stop_at)
        self._start: int = 0
        self._entered: int = -1            # the last iteration entered (or committed to by a jump)
        self._steps: Iterator[Any] = self._run()
        # An update and a grant go straight to the receive policy's and the ledger's own methods (both
        # objects are kept for the worker's life: heals and resumes reset them in place): one call per
        # message, not two (a simulation delivers millions). The class methods below document them; the
        # policy appends late updates to _pending_release itself.
        self.on_update = partial(self.policy.receive, self._pending_release)  # type: ignore[method-assign]
        if self.ledger is not None:
            self.on_grant = self.ledger.on_grant  # type: ignore[method-assign,assignment]
        elif self.acks is not None:
            self.on_grant = self.acks.on_ack      # type: ignore[method-assign,assignment]

    # ---- events from the transport ----
    def on_update(self, sender: int, iteration: int, handle: Any) -> None:
        """An update arrived. Its buffer is the worker's until a Reduce or a Release frees it."""
        self.policy.receive(self._pending_release, sender, iteration, handle)

    def on_grant(self, sender: int, cumulative: int) -> None:
        """A cumulative count from out-neighbour ``sender``: the tokens it has put into my queue in total
        (token queues), or the updates of mine it has consumed (notify-ack ACKs)."""
        if self.ledger is not None:
            self.ledger.on_grant(sender, cumulative)
        elif self.acks is not None:
            self.acks.on_ack(sender, cumulative)

    def reconfigure(self, view: NodeView, iterations: Any) -> None:
        """The graph around this worker changed -- workers failed and the survivors healed the graph
        (:mod:`hopdec.topology.heal`) -- while no message is in flight (the old communicator's are lost).

        ``view``: this worker's new :class:`NodeView`; ``iterations``: every surviving worker's current
        iteration. Updates and tokens are re-established on the changed edges: the receive policy takes
        the new senders and weights, and waits for a sender's updates only from the iteration it is at
        (older ones are lost or were never sent to this worker); the token queues follow Theorem 2's
        relation from the iterations (:meth:`TokenLedger.reset`). The first action afterwards sends this
        worker's current parameters, tagged with its iteration, to every out-neighbour, which replaces
        what was lost in flight. Runs on, from the current iteration: nothing is restarted.
        """
        if self.ledger is None:
            raise ValueError("reconfiguring a worker needs --protocol tokens")
        if view.steps or self.view.steps:
            raise ValueError("healing a time-varying topology is not supported")
        self.view = view
        self._pending_release += self.policy.reconfigure(
            view.in_weights, {j: int(iterations[j]) for j in view.in_neighbors}, effective_backup(self.cfg, view))
        self.ledger.reset(view.in_neighbors, view.out_neighbors, self.iteration,
                          {j: iterations[j] for j in view.out_neighbors})
        # this iteration's update went out already (and may be lost): send it again, to everyone now;
        # if it has not gone out yet, the ordinary Send(k) ahead will reach the new out-neighbours
        if self._last_sent == self.iteration:
            self._catch_up = SendParams(self.iteration, tuple(view.out_neighbors))

    # ---- what to do next ----
    def next_action(self) -> Any:
        """The next action; a :class:`Wait` is repeated until an event unblocks it."""
        if self._pending_release:
            return ReleaseUpdates(self.take_releases())
        if self._catch_up is not None:
            a, self._catch_up = self._catch_up, None
            return a
        return next(self._steps, _FINISHED)

    @property
    def catching_up(self) -> bool:
        """Whether the re-send that follows a :meth:`reconfigure` is still to come (the next action after
        any releases)."""
        return self._catch_up is not None

    def take_releases(self) -> tuple:
        """The handles of the updates this worker has let go of since the last :class:`ReleaseUpdates`
        (late arrivals, updates below the floor), taken: the next action will not release them again.
        A driver that keeps polling while the worker is paused between actions (the optimizer at
        ComputeGradient) releases them itself, so their receive slots take new updates meanwhile."""
        handles = tuple(e.handle for e in self._pending_release)
        self._pending_release.clear()           # (in place: on_update's shortcut appends to it)
        return handles

    def held_handles(self) -> list:
        """Handles of the buffers this worker still owns: updates it holds and those it is about to
        release (a transport must not reuse either before the core lets them go)."""
        return [e.handle for e in self.policy.queue.entries()] + [e.handle for e in self._pending_release]

    # ---- checkpoints and stops (hopdec.runtime.checkpoint, hopdec.runtime.interrupt) ----
    def resume_at(self, k: int) -> None:
        """Start at Enter(k) instead of Enter(0), as if iterations 0..k-1 had run, with every other worker
        resuming at k too (call before the first :meth:`next_action`).

        At Enter(k), before Send(k), a worker's protocol position is a function of k alone: it has issued
        k + max_ig tokens to each in-neighbour and taken k from each out-neighbour, which have granted
        k + max_ig (they entered k as well); with notify-ack every update < k has been sent and consumed
        and ACKed. Updates of iterations >= k it may have held are not needed: every in-neighbour sends
        them again from Enter(k). So resuming every worker at the same k continues the run exactly.
        """
        if self._entered >= 0 or self._start:
            raise RuntimeError("resume_at must be called once, before the worker starts")
        if not 0 <= k < self.budget:
            raise ValueError(f"resume_at({k}): the run has iterations 0..{self.budget - 1}")
        self.iteration, self._start, self._entered = k, k, k - 1
        if self.ledger is not None:
            led = self.ledger
            led.reset(led.ins, led.granted, k, dict.fromkeys(led.granted, k))
        if self.acks is not None:
            self.acks.sent = k
            self.acks.acked = {j: k for j in self.acks.acked}
            self.acks.consumed = {i: k for i in self.acks.consumed}
        self._pending_release += self.policy.set_floor(k)

    @property
    def last_sent(self) -> int:
        """The last iteration whose update this worker sent (its SendParams emitted), -1 before any."""
        return self._last_sent

    @property
    def position(self) -> int:
        """The last iteration this worker has entered, or committed to enter (a jump's target, whose
        refresh it has already done); ``start - 1`` before it starts."""
        return self._entered

    def stop_at(self, n: int) -> None:
        """End the run after iteration n - 1 instead of ``cfg.iterations - 1`` (n never raises it). Every
        worker must get the same n > every worker's :attr:`position` (e.g. the largest + 1): then none has
        passed it, and each finishes iterations up to n - 1 normally, so Enter(n) is a consistent cut."""
        if n <= self._entered:
            raise ValueError(f"stop_at({n}): worker {self.rank} is already at iteration {self._entered}")
        self.budget = min(self.budget, int(n))

    @property
    def held_updates(self) -> int:
        return self.policy.held

    def tokens(self) -> Optional[int]:
        """The tokens this worker may take from its scarcest out-neighbour (None without token queues):
        what a log records of the token queues."""
        led = self.ledger
        if led is None:
            return None
        return min([led.available(j) for j in self.view.out_neighbors], default=None)

    def counts(self) -> dict[str, int]:
        """What a log or a summary records of this worker's updates: held now, used and dropped in all,
        sends left out because the receiver was past them."""
        p = self.policy
        return {"held": p.held, "used": p.used, "dropped": p.dropped, "sends_skipped": self.sends_skipped}

    def capacity(self) -> int:
        """The most updates this worker may ever hold: (1 + max_ig) * |N_in(i)| with token queues (Hop
        sec. 4.2), |N_in(i)| with notify-ack (one outstanding update per sender), Theorem 1's path bound
        + 1 per sender with update queues only; N_in(i) without i: its own parameters never wait here."""
        return self.slots * len(self.view.in_neighbors)

    # ---- the iteration, as a generator of actions ----
    def _run(self) -> Iterator[Any]:
        cfg = self.cfg
        k = prev = self._start
        jumped_from: Optional[int] = None
        if k >= self.budget:
            return
        parallel = cfg.compute_graph == "parallel"
        # (actions built with .make, without a Python frame: a simulation builds millions)
        enter, compute, apply = Enter.make, ComputeGradient.make, ApplyGradient.make
        while True:
            # Entering k inserts one token per iteration entered (k - prev on a jump) into every local
            # token queue, at the same step as the iteration changes, so Theorem 2's relation holds.
            grants = self.ledger.issue(k - prev) if k > prev and self.ledger is not None else ()
            self._entered = k
            yield enter((k, jumped_from, grants))
            if parallel:
                if self.acks is not None:
                    yield from self._acked(k)
                yield self._send(k)
                yield compute((k,))
                yield from self._recv_reduce(k)
                yield apply((k,))
            else:
                yield compute((k,))
                yield apply((k,))
                if self.acks is not None:
                    yield from self._acked(k)
                yield self._send(k)
                yield from self._recv_reduce(k)
            if k + 1 >= self.budget:
                return
            jumped_from, target = None, k + 1
            if self.ledger is not None:
                jump_to = self._jump_target(k) if cfg.skip_max_jump else None   # skipping is on
                if jump_to is not None:
                    target, jumped_from = jump_to, k
                    self.jumps.append((k, target))
                    self._entered = target          # committed: a stop agreed from now on includes it
                    yield Jump(k, target)
                    # Recv(target - 1) + Reduce refresh the parameters before the jump (sec. 5); the
                    # target was chosen so that this Recv completes at once (see _jump_target).
                    yield from self._recv_reduce(target - 1)
                # the budget first: a stop_at() that came while waiting ends the run after iteration k
                # even when the tokens are there by the time the worker looks again
                while target < self.budget and not self.ledger.take_if(target - k):
                    yield Wait(tuple(j for j in self.view.out_neighbors
                                     if self.ledger.available(j) < target - k), "tokens")
                if target >= self.budget:
                    return
            prev, self.iteration, k = k, target, target

    def _straggler_lead(self) -> Optional[int]:
        """Iterations this worker may skip: it is >= trigger behind every out-neighbour (sec. 5; asked only
        with skipping on, see _run)."""
        if not self.view.out_neighbors:
            return None
        led = cast("TokenLedger", self.ledger)
        lead = min(led.lead_of(j) for j in self.view.out_neighbors)
        return lead if lead >= self.cfg.skip_trigger else None

    def _jump_target(self, k: int) -> Optional[int]:
        """Where a straggler at k jumps to (sec. 5), or None: the farthest k + d, 2 <= d <= min(max-jump,
        lead over the slowest out-neighbour, iterations left), whose Recv(k + d - 1) can complete *now*.

        The paper refreshes the parameters with Recv(target - 1) before jumping. Waiting there can
        deadlock on a directed graph: an in-neighbour that is not also an out-neighbour is held back by
        this worker's tokens (Theorem 2: at most max_ig ahead of it), which are only issued on entering
        the target, so it may never send update target - 1. Choosing a target whose Recv is already
        satisfied keeps the paper's refresh without ever waiting for it; the tokens the jump takes are
        there too (d <= lead), so a jump never blocks. On a symmetric graph this allows the same jumps as
        before in practice: in-neighbours are out-neighbours, which are ahead by the lead.
        """
        lead = self._straggler_lead()
        if lead is None:
            return None
        longest = min(self.cfg.skip_max_jump, lead, self.budget - 1 - k)
        every = self.cfg.checkpoint_every
        if every:                                   # never jump over a checkpoint iteration
            longest = min(longest, (k // every + 1) * every - k)
        for d in range(longest, 1, -1):
            if self.policy.ready(k + d - 1):
                return k + d
        return None

    def _acked(self, k: int) -> Iterator[Any]:
        """Notify-ack: Send(k) only once every out-neighbour has ACKed update k - 1 (sec. 3.3)."""
        acks = cast("AckLedger", self.acks)
        while not acks.may_send(k):
            yield Wait(tuple(acks.missing(k)), f"ACKs of update {k - 1}")
        acks.sent = k + 1

    def _send(self, k: int) -> SendParams:
        """Send(k), leaving out neighbours known to be past the last iteration that could use it (after
        :meth:`_acked` with notify-ack)."""
        view = self.view
        outs = view.out_at(k) if view.steps else view.out_neighbors   # a schedule's step k (sec. 3.1's
                                                                        # graph, time-varying)
        led = self.ledger
        useless: Any = ()
        if led is not None:
            # out-neighbour j is known to be at least at my iteration + its lead (TokenLedger.
            # lead_of); it is past every iteration that could use update k when
            # k < known - staleness
            base = self.iteration - led.max_ig - (self.cfg.staleness or 0) - led.taken_each
            granted = led.granted
            if granted and k < base + max(granted.values()):    # (usually nobody is past it: no list made)
                useless = [j for j in outs if k < base + granted[j]]
        if useless:
            self.sends_skipped += len(useless)
            dests = tuple(j for j in outs if j not in useless)
        else:
            dests = outs
        self._last_sent = k
        return SendParams.make((k, tuple(dests), tuple(useless)))

    def _recv_reduce(self, k: int) -> Iterator[Any]:
        self._pending_release += self.policy.set_floor(k)
        while (plan := self.policy.plan(k)) is None:
            yield Wait(tuple(self.policy.waiting_for(k)), f"updates of iteration {k}")
        gamma = self.cfg.consensus_step
        yield Reduce.make((k, plan if gamma == 1.0 else damped(plan, gamma)))   # gamma < 1: compressed exchanges
        self._pending_release += self.policy.set_floor(k + 1)
        if self.acks is not None:
            yield SendAcks(tuple(self.acks.consume(k)))


_FINISHED = Finished()


def node_views(graph: Any, backup_attr: str = "backup_workers", ahead: bool = True) -> list[NodeView]:
    """One :class:`NodeView` per node of a weighted ``nx.DiGraph`` (self-loops and weights present).

    ``ahead_bound`` is Theorem 1's bound on how far an in-neighbour j may be ahead of node i
    (len Path i->j), which sizes the update queue when no token queues bound the gap. A time-varying
    topology (the union graph of a schedule, :mod:`hopdec.topology.schedule`) gives each view its ``steps``;
    ``ahead_bound`` then counts each edge as long as its activation gap (:mod:`hopdec.hop.time_varying`).
    ``ahead=False`` leaves it None: only queue-only uses it (:attr:`hopdec.hop.protocols.Protocol.path_bounded`),
    and its searches are most of a run's start on a large graph whose paths are long or many.
    """
    from hopdec.topology.schedule import schedule_of
    sched = schedule_of(graph)
    if not ahead:
        ahead_of: Any = dict.fromkeys(graph.nodes)
    elif sched is not None:
        from hopdec.topology.schedule_analysis import ahead_bounds
        ahead_of = ahead_bounds(graph)
    else:
        ahead_of = _ahead_bounds(graph)
    views = []
    per_node = sched.node_steps() if sched is not None else None    # (nodes 0..n-1, as sorted(graph.nodes))
    for i in sorted(graph.nodes):
        in_w = {int(j): float(d["weight"]) for j, _, d in graph.in_edges(i, data=True)}
        outs = tuple(sorted(int(j) for j in graph.successors(i) if j != i))
        b = graph.nodes[i].get(backup_attr)
        ahead, steps = ahead_of[i], None
        if per_node is not None:
            steps = per_node[i]
        views.append(NodeView(int(i), in_w, outs, None if b is None else int(b), ahead, steps))
    return views


BFS_VISITS_PER_NODE = 200
"""Python breadth-first visits per node that :func:`_ahead_bounds` spends before it hands the remaining
sources to scipy (searches of a few dozen nodes on rings and tori; most of the graph on an
exponential graph, where 10,000 nodes took 106 s in Python)."""


def _ahead_bounds(graph: Any) -> dict:
    """node -> :func:`_farthest` of its in-neighbours, for every node: Python searches that stop early while
    they stay cheap (in-neighbours near), else every remaining source's search in C (scipy, in blocks of
    rows), which finds the same hop counts."""
    ins = {i: {j for j in graph.predecessors(i) if j != i} for i in graph.nodes}
    if _circulant(graph):       # every node sees the same paths: one search (10,000-node exponential: 14 s)
        return dict.fromkeys(graph.nodes, _farthest(graph, 0, ins[0]))
    out: dict = {}
    budget = [BFS_VISITS_PER_NODE * graph.number_of_nodes()]
    for i in sorted(graph.nodes):
        got = _farthest(graph, i, ins[i], budget)
        if got is None:
            break
        out[i] = got
    left = [i for i in sorted(graph.nodes) if i not in out]
    if left:
        out.update(_farthest_scipy(graph, left, ins))
    return out


def _circulant(graph: Any) -> bool:
    """Whether ``graph``'s nodes are 0..n-1 and its edges (self-loops aside) are the same offsets
    ``(j - i) mod n`` at every node, as rings, ring-based and exponential graphs: then ``i -> i + k mod n``
    maps the graph onto itself, so every node's farthest in-neighbour is as far as node 0's."""
    n = graph.number_of_nodes()
    if n == 0 or any(not isinstance(v, int) or not 0 <= v < n for v in graph.nodes):
        return False
    def offsets(i: int) -> set:
        return {(j - i) % n for j in graph.successors(i) if j != i}
    first = offsets(0)
    return all(offsets(i) == first for i in range(1, n))


def _farthest_scipy(graph: Any, sources: list, ins: dict) -> dict:
    import numpy as np
    from scipy.sparse import csgraph

    from hopdec.topology.bounds import _csr_pattern
    nodes = sorted(graph.nodes)
    index = {v: k for k, v in enumerate(nodes)}
    A = _csr_pattern(_relabelled(graph, index))
    out: dict[Any, Any] = {}
    rows = max(1, 4_000_000 // max(len(nodes), 1))          # 32 MB of distances at a time
    for start in range(0, len(sources), rows):
        block = sources[start:start + rows]
        D = csgraph.shortest_path(A, method="D", directed=True, unweighted=True,
                                  indices=[index[i] for i in block])
        for row, i in zip(D, block):
            targets = [index[j] for j in ins[i]]
            if not targets:
                out[i] = 1
                continue
            far = float(np.max(row[targets]))
            out[i] = int(far) if far != float("inf") else float("inf")
    return out


def _relabelled(graph: Any, index: dict) -> Any:
    """``graph`` with its nodes renamed 0..n-1 in sorted order (itself when they already are)."""
    if all(v == k for v, k in index.items()):
        return graph
    import networkx as nx
    return nx.relabel_nodes(graph, index, copy=True)


def _farthest(graph: Any, source: Any, targets: Any, budget: Optional[list] = None) -> Any:
    """The longest shortest path from ``source`` to any of ``targets`` (a breadth-first search that stops
    once it has seen them all: cheap where in-neighbours are near, as on every shipped graph). ``budget``:
    ``[visits left]``, shared by the calls; None (nothing done) once it is spent."""
    if not targets:
        return 1
    left, seen, frontier, depth = set(targets), {source}, [source], 0
    while frontier and left:
        depth += 1
        nxt = []
        for u in frontier:
            for v in graph.successors(u):
                if v not in seen:
                    seen.add(v)
                    nxt.append(v)
                    left.discard(v)
        frontier = nxt
        if budget is not None:
            budget[0] -= len(nxt)
            if budget[0] < 0:
                return None
    return depth if not left else float("inf")
