"""Worker deaths in virtual time (``hopdec sim --fault-tolerance --deaths / --death-trace / --churn-mttf``):
the survivors heal through the same code as a real ``hopdec train --fault-tolerance`` run.

Nothing of the protocol is decided here. A heal is :func:`hopdec.hop.heal.heal` -- the function every MPI
rank's :class:`hopdec.runtime.heal.Healer` calls: :func:`hopdec.topology.heal.heal_graph` (each dead
node's in-neighbours connected to its out-neighbours, the weights recomputed by the graph's rule) and
:meth:`hopdec.hop.worker.Worker.reconfigure` of every survivor from the survivors' iterations. This
module only carries out, in virtual time, what the MPI executor's parts do around it (ULFM,
:mod:`hopdec.transport.mpi`, :mod:`hopdec.runtime.hop_mpi`):

1. **death** at T: the worker stops where it is; what it sends or is sent from then on is lost, and an
   update of its still on the way when it died too (a crashed TCP stream); its neighbours wait for it.
2. **detection** at T + ``--failure-detection``: the communicator is revoked. Nothing is delivered any
   more and every send fails (an MPI call on a revoked communicator does); each survivor joins the
   recovery at its next wait (``MPITransport.wait`` raises ``PeerFailed`` there; a wait for its own sends
   to complete returns at once, so a computing worker goes on until it waits); a finished one at once
   (its shutdown fails).
3. **heal**, once every survivor joined and every death so far was detected (``MPI_Comm_shrink`` agrees on
   who failed; a death during the recovery is folded into it, as ``on_survivors`` shrinks again): every
   message of the old communicator is forgotten (``MPITransport.reconfigure``) and the graph healed.
4. ``--heal-stall`` later every survivor goes on from its own iteration; a finished one first sends its
   catch-up update, as ``hop_mpi`` does after a heal at shutdown.

Fewer than 2 survivors end the run with one line (:class:`~hopdec.topology.heal.CannotHeal`), as a real
run does. The deaths come from ``--deaths W@T``, a trace file (:func:`read_trace`) and seeded churn
(:func:`churn_deaths`); a worker dies at its earliest time, once; a worker that already finished its
iterations is not killed. Parameter-server runs hand each death to :meth:`hopdec.sim.ps.PSSim.fail`: the
server finds it ``--failure-detection`` later (ULFM fails its receive from the dead worker) and its core drops
the worker then; until then the sync policy still counts it (a BSP barrier waits for it, ASP goes on). No
stall follows: a real PS run neither revokes nor shrinks before its end (``--heal-stall`` is refused there).
"""

import math
import random
from functools import partial

from hopdec.core import Wait
from hopdec.errors import ConfigError, HopdecError
from hopdec.hop.heal import heal
from hopdec.runtime.hop_loop import worker_loop
from hopdec.settings.faults import plain_float, plain_int
from hopdec.sim.hop import SendsPending

MAX_TRACE_BYTES = 16 * 2 ** 20
"""A death trace is a text file of at most this many bytes (about a million deaths)."""
HEAL_LINES = 8
"""Heals the summary lists one line each; more are counted (every one is in the logs' ``heal`` events)."""
DEAD = Wait((), "nothing: this worker is dead (simulated)")


# ---- where the deaths come from ------------------------------------------------------------------
def _read_text(path, option):
    """The text of a trace file, read with the file guards (:func:`hopdec.files.read_bytes`: a regular
    file of sane size, opened without blocking); ConfigError naming the option and the file otherwise."""
    from hopdec.files import read_bytes
    try:
        raw = read_bytes(path, MAX_TRACE_BYTES, "a death trace file")
    except ConfigError as err:
        raise ConfigError(f"{option} {err}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{option} {path}: not a text file (expected 'SECONDS WORKER' lines)") from None
    return text[1:] if text.startswith("\ufeff") else text


def read_trace(path, workers, option="--death-trace"):
    """``[(seconds, worker)]`` from a trace file: one death per line, ``SECONDS WORKER`` (spaces, tabs or a
    comma between them), ``#`` comments and blank lines; ``workers``: the ids that exist. Anything else is
    a ConfigError naming the file and the line."""
    known = set(workers)
    out = []
    for no, line in enumerate(_read_text(path, option).splitlines(), 1):
        body = line.split("#", 1)[0].replace(",", " ").split()
        if not body:
            continue
        where = f"{option} {path}: line {no}"
        if len(body) != 2:
            raise ConfigError(f"{where}: expected 'SECONDS WORKER', got {line.strip()[:60]!r}")
        try:
            t, w = plain_float(body[0]), plain_int(body[1])
        except ValueError:
            raise ConfigError(f"{where}: expected 'SECONDS WORKER' (a number and a worker id), "
                              f"got {line.strip()[:60]!r}") from None
        if not (math.isfinite(t) and t >= 0):
            raise ConfigError(f"{where}: the time must be a finite number of seconds >= 0, got {body[0][:30]!r}")
        if w not in known:
            raise ConfigError(f"{where}: no worker {w} in this run ({_ids(workers)})")
        out.append((t, w))
    return out


def churn_deaths(mttf, workers, seed):
    """Seeded churn: each worker's death time, drawn from an exponential lifetime of mean ``mttf`` virtual
    seconds (its own stream of ``seed``, so adding workers leaves the others' times unchanged)."""
    return [(random.Random(f"churn {seed} {w}").expovariate(1.0 / mttf), w) for w in workers]


def planned_deaths(faults, workers, seed):
    """Every death the settings ask for (:class:`hopdec.settings.Faults`), ``[(seconds, worker)]`` by time,
    each worker once (at its earliest time); ``workers``: the ids that exist."""
    deaths = []
    for t, w in faults.deaths:
        if w not in set(workers):
            raise ConfigError(f"--deaths {w}@{t:g}: no worker {w} in this run ({_ids(workers)})")
        deaths.append((t, w))
    if faults.death_trace is not None:
        deaths += read_trace(faults.death_trace, workers)
    if faults.churn_mttf is not None:
        deaths += churn_deaths(faults.churn_mttf, workers, seed)
    first = {}
    for t, w in sorted(deaths):
        first.setdefault(w, t)
    return sorted((t, w) for w, t in first.items())


def _ids(workers):
    ws = list(workers)
    return f"workers {ws[0]}..{ws[-1]}" if ws else "no workers"


def describe(faults, deaths, mode="decentralized"):
    """The header's record of what was asked (labelled simulated), with the deaths up to a few dozen."""
    d = dict(simulated=True, deaths_planned=len(deaths), churn_mttf=faults.churn_mttf,
             death_trace=faults.death_trace, first_deaths=[[round(t, 6), w] for t, w in deaths[:32]])
    if mode == "decentralized":
        d.update(detect_s=faults.detect_s, heal_stall_s=faults.heal_stall_s)
    elif mode == "ps":                  # the server finds a death that late; nothing stalls (no recovery)
        d.update(detect_s=faults.detect_s, heal_stall_s=0.0)
    return d


def _background(q, t, fn):
    """``fn()`` at virtual time ``t`` without keeping the run going: a death planned after the last
    worker finished never happens (the queue's background count, as :meth:`EventQueue.every` keeps)."""
    def fire():
        q._bg -= 1
        fn()
    q._bg += 1
    q.at(t, fire)


# ---- the decentralized run: deaths, detection, the heal ------------------------------------------
class Churn:
    """Kills ``deaths`` (``[(seconds, worker)]``) in a :class:`hopdec.sim.hop.HopSim` before it runs and
    heals the survivors as the module says. ``graph``: the run's graph; ``detect_s``/``stall_s``: virtual
    seconds from a death to its detection, and of the recovery; ``invariants``: a
    :class:`hopdec.hop.invariants.Invariants` checked on the survivors (:meth:`check`, rebased at each heal);
    ``on_death(w)``, ``on_heal(event, joined)``: what the executor records (``joined``: survivor -> the
    virtual time it joined the recovery).

    ``heals``: one record per heal (the keys of a real run's ``heal`` event, times virtual); ``died``:
    ``[(seconds, worker, its iteration)]``; ``spared``: deaths not carried out (the worker had finished).
    """

    def __init__(self, sim, graph, deaths, detect_s, stall_s, invariants=None, on_death=None, on_heal=None):
        self.sim, self.graph = sim, graph
        self.detect_s, self.stall_s = float(detect_s), float(stall_s)
        self.inv, self.on_death, self.on_heal = invariants, on_death, on_heal
        self.alive = {c.rank: c for c in sim.cores}
        self.dead = set()
        self.undetected = []            # (time of death, worker): not yet detected
        self.unhealed = []              # deaths detected or not, not yet healed
        self.revoked = False            # between a detection and the heal
        self.epoch = 0                  # messages of an older communicator are lost
        self.joined = {}                # survivor -> virtual time it joined the recovery
        self.detected_at = None
        self.round = 0                  # which heal the scheduled resumption belongs to
        self.heals, self.died, self.spared = [], [], []
        self.planned = len(deaths)
        sim.net = _Gate(sim.net, self)
        sim.loops = [self._joining(r, loop) for r, loop in enumerate(sim.loops)]
        for t, w in deaths:
            _background(sim.q, t, partial(self._die, w))

    # what a survivor's loop does when the communicator is revoked
    def _joining(self, r, loop):
        for a in loop:
            if self.revoked:
                if type(a) is SendsPending:
                    continue            # the wait for its sends returns at once: they failed
                if type(a) is Wait:
                    self._join(r)
            yield a
        if self.revoked:
            self._join(r)               # finished: its shutdown fails, it joins

    def check(self, sim):
        """The Hop invariants (``HopSim``'s ``check``) on the workers of the graph healed last: a dead worker
        not healed yet counts with its last iteration (its neighbours wait for it, as before)."""
        cores = sim.cores
        self.inv.check({r: cores[r] for r in self.inv.ids}, sim.in_flight, sim.sent_to)

    # ---- 1. death ----
    def _die(self, w):
        sim, now = self.sim, self.sim.q.now
        if w in self.dead:
            return
        if sim.done[w] and not self.revoked:
            self.spared.append((now, w))
            return
        self.dead.add(w)
        core = self.alive.pop(w)
        self.joined.pop(w, None)
        self.died.append((now, w, core.iteration))
        if not sim.done[w]:
            sim.done[w] = True
            sim.finished += 1
        sim.loops[w] = _dead()          # never advances again (a compute it was in never ends)
        sim.blocked[w], sim.computing[w], sim.parked[w], sim.untaken[w] = True, False, None, []
        sim.gap.left(w)                 # the iteration gap counts the living only
        self.undetected.append((now, w))
        self.unhealed.append(w)
        if self.on_death is not None:
            self.on_death(w)
        sim.q.at(now + self.detect_s, self._detect)

    # ---- 2. detection: the communicator is revoked ----
    def _detect(self):
        sim, now = self.sim, self.sim.q.now
        # Deaths at one instant are found at one instant, and the first of their events finds them all (its
        # heal may take them at once): the others find nothing and start no recovery (one with nobody to
        # heal ended the simulation on a ValueError).
        if not any(t + self.detect_s <= now for t, _ in self.undetected):
            return
        self.undetected = [(t, w) for t, w in self.undetected if t + self.detect_s > now]
        if not self.revoked:
            self.revoked, self.detected_at = True, now
            sim.sends_abandoned = True  # a Reduce finds every store free (MPITransport.sends_done)
            self.epoch += 1
            self.round += 1             # a resumption still pending waits for this recovery
            for r in self.alive:
                sim.untaken[r] = []     # what was waiting to be taken is lost
                if sim.parked[r] is not None:       # its wait for sends fails: it goes on to its next wait
                    sim.parked[r] = None
                    sim.q.at(now, partial(sim._advance, r))
                elif sim.blocked[r] or sim.done[r]:
                    self.joined[r] = now
        self._maybe_heal()

    def _join(self, r):
        self.joined.setdefault(r, self.sim.q.now)
        self._maybe_heal()

    # ---- 3. the heal ----
    def _maybe_heal(self):
        if self.revoked and not self.undetected and len(self.joined) == len(self.alive):
            self._heal()

    def _heal(self):
        sim, now = self.sim, self.sim.q.now
        failed = sorted(self.unhealed)
        iterations = {r: c.iteration for r, c in self.alive.items()}
        try:
            healed, notes = heal(self.graph, failed, self.alive, iterations)
        except HopdecError as err:
            raise type(err)(f"simulated death at virtual second {self.died[-1][0]:.6g}: {err}") from None
        self.graph = healed
        self.unhealed, self.revoked = [], False
        sim.sends_abandoned = False
        self.epoch += 1
        for r in self.alive:            # every message of the old communicator is forgotten
            sim.unsent[r][:] = [0] * len(sim.unsent[r])     # (the pool of stores stays as it grew)
            sim.parked[r] = None
            sim.untaken[r] = []
            sim.sent_to[r] -= sim.in_flight[r]
            sim.in_flight[r] = 0
        if self.inv is not None:
            self.inv.rebase(healed, self.alive)
        resume = now + self.stall_s
        at = {w: (t, k) for t, w, k in self.died}
        event = dict(time=self.detected_at, failed=failed, survivors=sorted(self.alive),
                     iteration=min(at[w][1] for w in failed), stall_s=round(resume - self.detected_at, 9),
                     detect_s=self.detect_s, died_at=[round(at[w][0], 9) for w in failed],
                     healed_at=now, resumed_at=resume, spectral_gap=None, notes=notes)
        self.heals.append(event)
        if self.on_heal is not None:
            self.on_heal(event, dict(self.joined), iterations)
        self.joined = {}
        self.round += 1
        sim.q.at(resume, partial(self._resume, self.round))

    # ---- 4. the survivors go on ----
    def _resume(self, round_):
        if round_ != self.round or self.revoked:
            return                      # another death came first: its recovery resumes them
        sim = self.sim
        for r in sorted(self.alive):
            if sim.done[r]:             # finished: its catch-up update, then done again
                sim.done[r] = False
                sim.finished -= 1
                sim.loops[r] = self._joining(r, worker_loop(sim.cores[r], sim.ios[r], sim.backends[r],
                                                            clock=sim._clock, step=sim.steps,
                                                            detail=sim.detail, instant=True))
            sim.blocked[r] = False
            sim._advance(r)


def _dead():
    while True:
        yield DEAD


class _Gate:
    """The network as the communicator lets it be used: a message sent while it is revoked is lost, and one
    of an older communicator, or from or to a dead worker, is lost on arrival (the rest is the network's)."""

    def __init__(self, net, churn):
        self._net, self._churn = net, churn

    def __getattr__(self, name):
        return getattr(self._net, name)

    def send(self, src, dsts, nbytes, deliver):
        c = self._churn
        if not c.revoked and src not in c.dead:
            self._net.send(src, dsts, nbytes, partial(_arrive, c, c.epoch, src, deliver))

    def control(self, src, dsts, deliver):
        c = self._churn
        if not c.revoked and src not in c.dead:
            self._net.control(src, dsts, partial(_arrive, c, c.epoch, src, deliver))


def _arrive(churn, epoch, src, deliver, dst):
    if epoch == churn.epoch and src not in churn.dead and dst not in churn.dead:
        deliver(dst)


def attach(sim, hop, faults, deaths, fidelity, log_event, invariants=None, trainers=None):
    """:class:`Churn` for ``hopdec sim``: ``hop`` (:class:`hopdec.modes.HopRun`), ``faults``
    (:class:`hopdec.settings.Faults`); ``log_event(rank, name, **data)`` writes each survivor's ``heal``
    event (a real run's keys, times virtual, labelled ``simulated``); a dead worker's trainer (``--math``)
    leaves ``trainers``, so the averaged model is the survivors'."""
    def on_death(w):
        if trainers is not None:
            trainers.pop(w, None)

    def on_heal(event, joined, iterations):
        event["spectral_gap"] = gap = _gap(churn.graph)
        for r, core in churn.alive.items():
            v = core.view                       # reconfigured to the healed graph
            log_event(r, "heal", time=event["time"], failed=event["failed"], survivors=event["survivors"],
                      iteration=iterations[r], stall_s=round(event["resumed_at"] - joined[r], 9),
                      spectral_gap=gap, in_neighbors=list(v.in_neighbors),
                      out_neighbors=list(v.out_neighbors), notes=event["notes"], simulated=fidelity,
                      died_at=event["died_at"])

    churn = Churn(sim, hop.graph, deaths, faults.detect_s, faults.heal_stall_s, invariants, on_death, on_heal)
    if invariants is not None:
        sim.check = churn.check
    return churn


# ---- the parameter server ------------------------------------------------------------------------
def kill_ps_workers(sim, deaths, detect_s=0.0, label=None):
    """Each ``(seconds, worker)`` of ``deaths`` dies in a :class:`hopdec.sim.ps.PSSim`, found by the server
    ``detect_s`` virtual seconds later (:meth:`~hopdec.sim.ps.PSSim.fail`: its core drops the worker then,
    :meth:`hopdec.ps.server.Server.on_worker_failed`); ``label``: the fidelity its ``failure`` note carries
    as ``simulated``. A death never keeps a finished run going; the last living worker cannot die."""
    def kill(w, t):
        living = set(sim.policy.workers) - sim.dead
        if not sim.done[w] and living == {w}:
            raise HopdecError(f"simulated death at virtual second {t:.6g}: worker {w} was the last one: a "
                              f"parameter server needs at least one worker")
        sim.fail(w, t, detect_s, note=None if label is None else {"simulated": label})
    for t, w in deaths:
        _background(sim.q, t, partial(kill, w, t))


def check_ps(faults, deaths):
    """``--mode ps``: what cannot be simulated there, refused with one line. ``--failure-detection`` applies
    (the server finds a death that late); ``--heal-stall`` does not: a real PS run has no recovery to
    stall (its server buries the dead worker's requests and goes on; no revoke, no shrink until the end)."""
    from hopdec.settings.faults import HEAL_STALL_S
    if any(w == 0 for _, w in deaths):
        raise ConfigError("simulated deaths: the parameter server (rank 0) cannot die -- a real run ends with "
                          "one line then (it holds the only model); kill workers 1..n")
    if faults.heal_stall_s != HEAL_STALL_S:
        raise ConfigError("--heal-stall: decentralized runs only (--mode ps has no recovery to stall: the "
                          "server drops a dead worker once it finds it, after --failure-detection, and goes on, "
                          "as a real run's server does without revoking or shrinking)")


def ps_gap_entries(sim, stats):
    """``(entries, gone)`` for :func:`hopdec.report.gaps.largest_gap` from each worker's logged iterations
    (``stats[w].entries``): a dead worker counts until the server dropped it (its ``failure`` note), with
    the mini-batches the server released it into that its log never closed (a record is logged at the next
    weights: the one it died in, and one whose weights were on the way)."""
    found = {d["worker"]: d["time"] for d in sim.notes("failure")}
    entries = []
    for w, s in stats.items():
        last = s.entries[-1][1] if s.entries else -1
        entries.append(s.entries + [e for e in (sim.entered(w) if w in sim.dead else ()) if e[1] > last])
    return entries, [found.get(w) for w in stats]


def ps_summary_lines(sim, detect_s, fidelity, planned=None):
    """The summary's first line on a parameter-server run's simulated deaths (``sim``: the PSSim;
    ``planned``: how many deaths were planned)."""
    found = len(sim.server.failed)
    never = 0 if planned is None else planned - len(sim.died) - len(sim.spared)
    return [f"deaths ({fidelity}): {len(sim.died)} worker(s) died, {found} found and dropped by the server "
            f"{detect_s:g} virtual s after each death (--failure-detection; until then its sync policy still "
            f"counted the dead worker; no recovery stall: a parameter-server run neither revokes nor shrinks)"
            + (f"; {len(sim.spared)} planned death(s) came after the worker had finished" if sim.spared else "")
            + _never(never, sim.q.now if sim.end_time is None else sim.end_time)]


def _never(k, end):
    """The planned deaths a run never reached: the last worker finished before their time (they went
    unmentioned, and a trace whose times were in the wrong unit read as a run nobody died in)."""
    return f"; {k} planned death(s) came after the run had ended at virtual second {end:.6g}" if k > 0 else ""


# ---- what the summary says ------------------------------------------------------------------------
def summary_lines(churn, hop, bound, fidelity):
    """The summary's lines on the simulated deaths and heals (``hop``: the :class:`hopdec.modes.HopRun`)."""
    c = churn
    lines = [f"deaths ({fidelity}): {len(c.died)} worker(s) died, {len(c.heals)} heal(s); each found "
             f"{c.detect_s:g} virtual s after the death, the recovery {c.stall_s:g} virtual s once every "
             f"survivor joined it; {len(c.alive)} survivors finished"
             + (f"; {len(c.spared)} planned death(s) came after the worker had finished" if c.spared else "")
             + _never(c.planned - len(c.died) - len(c.spared), c.sim.q.now)]
    if not c.heals:
        return lines
    heals = c.heals if len(c.heals) <= HEAL_LINES else c.heals[:HEAL_LINES - 2] + c.heals[-2:]
    if bound is not None:
        notes = hop.heal_notes(heals, c.graph, bound)
    else:
        from hopdec.modes.decentralized import rank_list
        notes = [f"failure: rank(s) {rank_list(h['failed'])} died near iteration {h['iteration']}; "
                 f"{len(h['survivors'])} survivors healed the graph in {h['stall_s']:.4g} virtual s" for h in heals]
        notes.append(f"after the failures: {c.graph.number_of_nodes()} workers (the healed graph's gap bound "
                     f"is not computed at this size)")
    if len(heals) < len(c.heals):
        notes.insert(HEAL_LINES - 2, f"... {len(c.heals) - len(heals)} more heals (every one is a 'heal' event "
                                     f"in the survivors' logs)")
    return lines + ["  " + n.replace(" s (spectral gap", " virtual s (spectral gap") for n in notes]


GAP_UP_TO = 2048
"""A heal records the healed graph's spectral gap up to this many workers (a sparse eigenproblem per heal)."""


def _gap(graph):
    from hopdec.runtime.heal import _gap as spectral
    return spectral(graph) if graph.number_of_nodes() <= GAP_UP_TO else None
