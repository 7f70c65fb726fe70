"""Parameter-exchange cost of hopdec against a bare mpi4py exchange of the same bytes.

    mpirun -n 8 --oversubscribe python3 experiments/bench_exchange.py [--plan MB:WARMUP:TIMED:REPS,...] [--no-busy] [--json]

Both sides run on the same graph (``topologies/ring_based_8.json``) in the same MPI job, in interleaved
rounds (hopdec, bare, hopdec-busy, bare, ... for each repetition) so machine noise hits all of them.

* **hopdec**: the real :class:`hopdec.hop.worker.Worker` (tokens protocol, ``--max-ig``, parallel compute
  graph) driven by :func:`hopdec.runtime.hop_loop.worker_loop` over :class:`hopdec.transport.mpi.MPITransport`
  (waiting with its own ``wait``: Testsome back to back, yielding the core, for 2 ms, then sleeps of 10 us
  doubling to 1 ms). The backend does no
  compute (``compute`` returns at once); ``reduce`` does the real weighted sum with numpy.
* **bare**: per iteration every rank Irecvs from its in-neighbours into preallocated buffers, Isends its
  parameter buffer to its out-neighbours, ``Waitall``, then the *same* numpy weighted sum. No barrier
  inside the loop.
* ``--ablation MB``: instead of the table, splits hopdec's overhead at one size (bare + hopdec's send
  copy, bare + its rotating receive slots, hopdec with queue-only protocol = no grant messages, hopdec
  whose loop polls only in ``wait``, and waits that never sleep, nap at once (hopdec's wait before it
  spun first) or spin longer; ``--reps``, ``--timed``).
* **hopdec-busy** (profiling, ``--no-busy`` to leave out): hopdec with ``MPITransport.wait`` replaced by
  a poll loop without sleeps, to measure what the sleep backoff costs.

``--device cuda`` (each rank on ``cuda:(rank mod #GPUs)``): the parameters are a CUDA tensor. hopdec
runs the engine's GPU path -- :class:`hopdec.ml.trainer.FlatModel` (``write_params``: one copy to a pinned
host send buffer; ``reduce``: each received update copied into a device stage, then added), over an
``MPITransport`` with pinned host buffers -- or, where the MPI is CUDA-aware, device buffers handed to MPI
(``--cuda-aware-mpi``). **bare** does the same with plain mpi4py: staged (one copy of the parameters to a
pinned host buffer, Irecv into pinned host buffers, Isend, ``Waitall``, each update copied to the device
and added) or, CUDA-aware, Isend/Irecv on device tensors, then the same torch reduce. Both count the same
bytes across PCIe; ``copy`` is then the copy to the host, ``reduce`` includes the copies back.

So both sides include the reduce (same function, same arrays sizes); the reported ``reduce ms`` is its
cost on the hopdec side, for who wants exchange-only figures (subtract it from both columns).
Per-iteration time of one rank = (time it finished its last iteration - time it entered the first timed
iteration) / timed iterations; the table gives the mean over ranks, then the median (and the min) over
repetitions; ``ratio`` = hopdec / bare of the medians, ``(min)`` the same of the minima. The hopdec
breakdown (medians, ms/iter): ``copy`` = parameters into the send ring, ``reduce``, ``wait`` = time in
``MPITransport.wait`` (updates or tokens not there yet), ``rest`` = everything else (protocol core, loop,
Isend/Irecv posting, Testsome calls outside wait, where Open MPI moves the data of large messages).
``CPU ms/rank``: process CPU time per iteration and rank (mean over ranks, median over reps) of hopdec
and of bare: with 8 ranks on 2 cores the exchange is CPU-bound, so ms/iter ~ CPU ms/rank * 8 / cores.
Receive and send buffers are touched before timing (no first-touch page faults in the timed part).
Rank 0 prints; with ``--json`` it prints one JSON object instead of the table (the per-repetition lines
go to stderr), to compare commits: per size the medians and minima in ms/iter of each side, the ratios,
the hopdec breakdown and the CPU ms per rank and iteration of both sides (``extra_cpu_ms`` = the
difference), plus the load average before and after the run.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from hopdec import topology as T
from hopdec.runtime.hop_loop import worker_loop
from hopdec.hop.config import ProtocolConfig
from hopdec.hop.worker import Worker, node_views
from hopdec.transport.mpi import MPITransport
from hopdec.transport.waiting import poll_until

TAG = 77
HERE = os.path.dirname(os.path.abspath(__file__))
clock = time.perf_counter


def weighted_sum(acc, tmp, pairs):
    """acc <- sum(w * src); the one reduce both sides run (no temporaries allocated)."""
    (src, w), rest = pairs[0], pairs[1:]
    np.multiply(src, w, out=acc)
    for src, w in rest:
        np.multiply(src, w, out=tmp)
        acc += tmp


class NoComputeBackend:
    """Backend for the worker loop: no compute; real reduce; times its copy and reduce."""

    def __init__(self, params):
        self.params = params
        self.acc = np.empty_like(params)
        self.tmp = np.empty_like(params)
        self.fill_s = self.reduce_s = 0.0

    def write_params(self, out=None):
        t0 = clock()
        if out is None:
            out = self.params.copy()
        else:
            np.copyto(out, self.params)
        self.fill_s += clock() - t0
        return out

    def compute(self, iteration):
        return {"loss": 0.0, "compute_s": 0.0}

    # zero-copy sends, as LocalTrainer.use_send_storage: the parameters live in one of a pool of
    # message-sized arrays (stores[0]); the transport sends it as it is, Reduce writes a free one
    # (the worker loop picks it, hopdec.runtime.hop_loop.writable_store) and it becomes stores[0]
    stores = None

    def use_send_storage(self, length):
        n = self.params.size
        self.stores = [np.zeros(length, dtype=np.float32) for _ in range(2)]
        self.stores[0][:n] = self.params
        self.params, self.acc = self.stores[0][:n], self.stores[1][:n]

    def send_storage(self):
        return None if self.stores is None else self.stores[0]

    def spare_stores(self):
        return None if self.stores is None else self.stores[1:]

    def add_store(self):
        self.stores.append(np.zeros(self.stores[0].size, dtype=np.float32))
        return self.stores[-1]

    def reduce(self, pairs, into=None):
        t0 = clock()
        acc = self.acc if into is None else into[:self.params.size]
        weighted_sum(acc, self.tmp, [(self.params if a is None else a, w) for a, w in pairs])
        if into is not None:                         # the picked store holds the values from now on
            self.stores = [into] + [s for s in self.stores[1:] if s is not into] + self.stores[:1]
        self.params, self.acc = acc, self.params
        self.reduce_s += clock() - t0

    def apply(self, iteration):
        pass


class TorchNoComputeBackend:
    """``--device cuda``: no compute; the parameters are a :class:`FlatModel` on the GPU, sent and reduced
    by the engine's own ``write_params`` / ``reduce`` (staged through pinned host memory, or device
    buffers with a CUDA-aware MPI); times them as :class:`NoComputeBackend` does."""

    def __init__(self, params):
        import torch

        from hopdec.ml.trainer import FlatModel
        self.m = FlatModel([torch.nn.Parameter(params)])
        self.fill_s = self.reduce_s = 0.0
        self.send_storage = self.spare_stores = self.add_store = None

    @property
    def params(self):
        return self.m.values()

    def use_send_storage(self, length, on_device=False):
        if self.m.use_send_storage(length, on_device=on_device):
            self.send_storage, self.spare_stores, self.add_store = (
                self.m.send_storage, self.m.spare_stores, self.m.add_store)

    def write_params(self, out=None):
        t0 = clock()
        out = self.m.write_params(out)
        self.fill_s += clock() - t0
        return out

    def compute(self, iteration):
        return {"loss": 0.0, "compute_s": 0.0}

    def reduce(self, pairs, into=None):
        t0 = clock()
        self.m.reduce(pairs, into=into)
        self.reduce_s += clock() - t0

    def apply(self, iteration):
        pass


def cuda_bare(comm, view, params, warmup, timed, aware):
    """bare on a GPU: staged through pinned host buffers (or device buffers when ``aware``), then the
    same torch reduce hopdec runs (:func:`hopdec.ml.trainer.weighted_sum_into`). Returns (s/iter,
    CPU s/iter, params)."""
    import torch

    from hopdec.ml.trainer import weighted_sum_into
    ins, outs = view.in_neighbors, view.out_neighbors
    n, dev = params.numel(), params.device
    host = (lambda: torch.zeros(n, device=dev)) if aware else (lambda: torch.zeros(n).pin_memory().numpy())
    rb = {j: host() for j in ins}
    send = host()
    acc, stage = torch.empty_like(params), torch.empty_like(params)
    comm.Barrier()
    start = cpu0 = None
    for k in range(warmup + timed):
        if k == warmup:
            start, cpu0 = clock(), time.process_time()
        reqs = [comm.Irecv(rb[j], source=j, tag=TAG) for j in ins]
        if aware:
            torch.cuda.synchronize(dev)
            sb = params
        else:
            torch.from_numpy(send).copy_(params)
            sb = send
        reqs += [comm.Isend(sb, dest=d, tag=TAG) for d in outs]
        MPI.Request.Waitall(reqs)
        weighted_sum_into(params, [(None, view.in_weights[view.rank])] + [(rb[j], view.in_weights[j]) for j in ins],
                          acc, stage)
        params, acc = acc, params
    end, cpu = clock(), time.process_time() - cpu0
    comm.Barrier()
    return (end - start) / timed, cpu / timed, params


class BusyTransport(MPITransport):
    """MPITransport whose wait polls without sleeping (profiling variant)."""

    def wait(self, core, wait_action):
        while not self.poll(core):
            pass


def _sleep_first(poll):
    """Poll until something arrived, sleeping 50 us first and doubling to 1 ms (the ablation's wait)."""
    nap = 5e-5
    while True:
        time.sleep(nap)
        if poll():
            return
        nap = min(nap * 2, 1e-3)


class _NoPrePoll(MPITransport):
    """Ablation: the loop's poll before every action does nothing; waits (and close) poll."""

    def poll(self, core=None):
        return 0

    def _drain(self, done, what):
        def polled():               # (the real drain, with its timeout, polling as the real poll does)
            MPITransport.poll(self, None)
            return done()
        MPITransport._drain(self, polled, what)


class WaitOnlyPollTransport(_NoPrePoll):
    """No polls before actions, and the ablation's own wait (:func:`_sleep_first`)."""

    def wait(self, core, wait_action):
        if not MPITransport.poll(self, core):
            _sleep_first(lambda: MPITransport.poll(self, core))


class NoPrePollTransport(_NoPrePoll):
    """No polls before actions; the transport's own wait (poll first, then naps from 10 us)."""

    def wait(self, core, wait_action):
        poll_until(lambda: MPITransport.poll(self, core), None, "")


class SleepFirstWaitTransport(MPITransport):
    """Polls before every action as hopdec does; the ablation's wait (:func:`_sleep_first`)."""

    def wait(self, core, wait_action):
        _sleep_first(lambda: self.poll(core))


def _spinning(seconds):
    """MPITransport whose waits poll (yielding) for ``seconds`` before they nap (``spin_s``; 0: at once)."""
    class Spinning(MPITransport):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.spin_s = seconds
    return Spinning


def run_hopdec(comm, view, params, warmup, timed, max_ig, busy=False, protocol="tokens",
               transport=None, aware=False):
    """One hopdec round; returns (s/iter over the timed iterations, breakdown dict) of this rank.
    ``params``: a numpy array, or a CUDA tensor (the GPU path: pinned host buffers, or device buffers
    when ``aware``)."""
    cfg = ProtocolConfig(iterations=warmup + timed, protocol=protocol, max_ig=max_ig)
    core = Worker(view, cfg)
    transport = transport or (BusyTransport if busy else MPITransport)
    gpu = not isinstance(params, np.ndarray)
    if gpu:
        io = transport(comm, view, params.numel(), core.slots, host_pinned=True,
                       device_buffers=params.device if aware else None)
        backend = TorchNoComputeBackend(params)
        backend.use_send_storage(io.message_floats(), on_device=aware)   # as hop_mpi does
    else:
        io = transport(comm, view, params.size, core.slots)
        backend = NoComputeBackend(params)
        backend.use_send_storage(io.message_floats())    # the engine's default on CPU (no send copy)
    for b in io.bufs.values():                       # pre-fault every buffer outside the timed part
        b.fill_(0) if gpu and not isinstance(b, np.ndarray) else b.fill(0)
    marks = {}
    wait_s = [0.0]

    def on_record(rec):          # the record of iteration warmup-1 closes as iteration warmup starts
        if rec["iter"] == warmup - 1:
            marks["start"] = clock()
            marks["cpu"] = time.process_time()
            marks["fill0"], marks["reduce0"], marks["wait0"] = (backend.fill_s, backend.reduce_s,
                                                                wait_s[0])

    comm.Barrier()
    loop = worker_loop(core, io, backend, on_record=on_record, clock=clock)
    for w in loop:
        t0 = clock()
        io.wait(core, w)
        wait_s[0] += clock() - t0
    end, cpu_end = clock(), time.process_time()
    per_iter = (end - marks["start"]) / timed
    parts = dict(cpu=(cpu_end - marks["cpu"]) / timed,
                 fill=(backend.fill_s - marks["fill0"]) / timed,
                 reduce=(backend.reduce_s - marks["reduce0"]) / timed,
                 wait=(wait_s[0] - marks["wait0"]) / timed)
    io.close()
    comm.Barrier()
    return per_iter, parts, backend.params


def run_bare(comm, view, params, rbufs, acc, tmp, warmup, timed):
    """One bare mpi4py round, same structure: post, Waitall, weighted sum. Returns s/iter."""
    ins, outs = view.in_neighbors, view.out_neighbors
    w_self = view.in_weights[view.rank]
    comm.Barrier()
    start = cpu0 = None
    for k in range(warmup + timed):
        if k == warmup:
            start, cpu0 = clock(), time.process_time()
        reqs = [comm.Irecv(rbufs[j], source=j, tag=TAG) for j in ins]
        reqs += [comm.Isend(params, dest=d, tag=TAG) for d in outs]
        MPI.Request.Waitall(reqs)
        weighted_sum(acc, tmp, [(params, w_self)] + [(rbufs[j], view.in_weights[j]) for j in ins])
        params, acc = acc, params
    end, cpu = clock(), time.process_time() - cpu0
    comm.Barrier()
    return (end - start) / timed, cpu / timed, params, acc


def run_bare_variant(comm, view, params, acc, tmp, warmup, timed, copy=False, slots=1):
    """Ablation: bare, plus hopdec's send copy into a 3-deep ring and/or its ``slots`` rotating receive
    buffers per in-neighbour (a larger memory footprint)."""
    ins, outs = view.in_neighbors, view.out_neighbors
    rb = {(j, s): np.zeros(params.size + 2, np.float32) for j in ins for s in range(slots)}
    ring = [np.zeros(params.size + 2, np.float32) for _ in range(3)]
    comm.Barrier()
    start = None
    for k in range(warmup + timed):
        if k == warmup:
            start = clock()
        s = k % slots
        reqs = [comm.Irecv(rb[(j, s)], source=j, tag=TAG) for j in ins]
        sb = params
        if copy:
            sb = ring[k % 3]
            np.copyto(sb[:params.size], params)
        reqs += [comm.Isend(sb, dest=d, tag=TAG) for d in outs]
        MPI.Request.Waitall(reqs)
        weighted_sum(acc, tmp, [(params, view.in_weights[view.rank])]
                     + [(rb[(j, s)][:params.size], view.in_weights[j]) for j in ins])
        params, acc = acc, params
    end = clock()
    comm.Barrier()
    return (end - start) / timed, params, acc


def ablation(comm, view, mb, reps, warmup, timed, max_ig):
    """Which part of hopdec's overhead is what: interleaved variants at one size; rank 0 prints."""
    n = int(mb * 2 ** 20) // 4
    params = np.random.default_rng(comm.Get_rank()).standard_normal(n).astype(np.float32)
    acc, tmp = np.zeros(n, np.float32), np.zeros(n, np.float32)
    variants = {
        "bare": lambda p, a: run_bare_variant(comm, view, p, a, tmp, warmup, timed),
        "bare + send copy": lambda p, a: run_bare_variant(comm, view, p, a, tmp, warmup, timed,
                                                          copy=True),
        "bare + 3 recv slots": lambda p, a: run_bare_variant(comm, view, p, a, tmp, warmup, timed,
                                                             slots=max_ig + 1),
        "bare + copy + 3 slots": lambda p, a: run_bare_variant(comm, view, p, a, tmp, warmup, timed,
                                                               copy=True, slots=max_ig + 1),
        "hopdec": None,
        "hopdec queue-only (no grants)": "queue-only",
        "hopdec poll only in wait": WaitOnlyPollTransport,
        "hopdec no pre-action polls": NoPrePollTransport,
        "hopdec sleep-first wait": SleepFirstWaitTransport,
        "hopdec busy wait": BusyTransport,
        "hopdec naps at once (no spin)": _spinning(0.0),
        "hopdec spin 400 us": _spinning(4e-4),
        "hopdec spin 10 ms": _spinning(1e-2),
    }
    res = {v: [] for v in variants}
    names = list(variants)
    for rep in range(reps):
        for v in (names if rep % 2 == 0 else names[::-1]):
            f = variants[v]
            if callable(f) and not isinstance(f, type):
                s, params, acc = f(params, acc)
            else:
                s, _, params = run_hopdec(comm, view, params, warmup, timed, max_ig,
                                          protocol=f if isinstance(f, str) else "tokens",
                                          transport=f if isinstance(f, type) else None)
                acc = np.empty_like(params)
            res[v].append(statistics.mean(comm.allgather(s)))
    if comm.Get_rank() == 0:
        base = statistics.median(res["bare"])
        print(f"ablation at {mb:g} MB, {warmup}+{timed} iterations x {reps} interleaved reps "
              f"(median of the per-rep means over ranks):")
        for v in names:
            m = statistics.median(res[v])
            print(f"  {v:<30} {m * 1e3:8.2f} ms/iter  {m / base:5.2f}x bare")


def _commit():
    """The commit of the checkout ``hopdec`` was imported from (with ``+dirty`` for local changes), or
    None outside git."""
    import subprocess

    import hopdec
    where = os.path.dirname(os.path.abspath(hopdec.__file__))
    try:
        run = lambda *a: subprocess.run(["git", "-C", where, *a], capture_output=True, text=True,
                                        timeout=10).stdout.strip()
        return (run("rev-parse", "--short", "HEAD") or None) and (
            run("rev-parse", "--short", "HEAD") + ("+dirty" if run("status", "--porcelain", "-uno") else ""))
    except (OSError, subprocess.SubprocessError):
        return None


def as_json(rows, variants, args, size, total_s, load_before):
    """The table as one JSON-able dict (ms per iteration; ratios of medians and of minima)."""
    out = []
    for mb, med, bd, low, plan in rows:
        row = dict(mb=mb, plan=plan, hopdec_ms=med["hopdec"], bare_ms=med["bare"],
                   hopdec_min_ms=low["hopdec"], bare_min_ms=low["bare"],
                   ratio=med["hopdec"] / med["bare"], ratio_min=low["hopdec"] / low["bare"],
                   copy_ms=bd["fill"], reduce_ms=bd["reduce"], wait_ms=bd["wait"],
                   rest_ms=med["hopdec"] - bd["fill"] - bd["reduce"] - bd["wait"],
                   cpu_ms_hopdec=bd["cpu"], cpu_ms_bare=bd["bare_cpu"], extra_cpu_ms=bd["cpu"] - bd["bare_cpu"])
        if "hopdec-busy" in variants:
            row.update(busy_ms=med["hopdec-busy"], busy_min_ms=low["hopdec-busy"],
                       busy_ratio=med["hopdec-busy"] / med["bare"])
        out.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    return dict(commit=_commit(), device=args.device, topology=os.path.basename(args.topology), ranks=size,
                max_ig=args.max_ig,
                cores=os.cpu_count(), total_s=round(total_s, 1), load_before=load_before,
                load_after=os.getloadavg(), rows=out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default=os.path.join(HERE, "..", "topologies", "ring_based_8.json"))
    p.add_argument("--plan", default="1:3:20:5,4:3:15:5,16:2:6:4,64:2:4:3",
                   help="per size MB:warmup:timed:reps (comma-separated); the default keeps the whole "
                        "run near 2-3 minutes on 2 cores")
    p.add_argument("--max-ig", type=int, default=2)
    p.add_argument("--no-busy", action="store_true", help="leave out the busy-poll hopdec variant")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object (rank 0)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: rank r on cuda:(r mod #GPUs) (the "
                   "GPU path: staged through pinned host memory, or device buffers with a CUDA-aware MPI)")
    p.add_argument("--cuda-aware-mpi", choices=["auto", "yes", "no"], default="auto",
                   help="--device cuda: hand device buffers to MPI (auto: when the MPI says it can)")
    p.add_argument("--ablation", type=float, default=None, metavar="MB",
                   help="instead of the table: split hopdec's overhead at this size (bare + send copy, "
                        "bare + rotating receive slots, hopdec without grants, without pre-action polls, "
                        "with other waits)")
    p.add_argument("--reps", type=int, default=5, help="--ablation: interleaved repetitions (default 5)")
    p.add_argument("--timed", type=int, default=20, help="--ablation: timed iterations per repetition "
                   "(default 20; a few ms each at 1 MB: take 100 or more on a noisy machine)")
    args = p.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    graph = T.load(args.topology)
    if graph.number_of_nodes() != size:
        if rank == 0:
            print(f"{args.topology} has {graph.number_of_nodes()} nodes; run with mpirun -n "
                  f"{graph.number_of_nodes()}", file=sys.stderr)
        return 2
    view = node_views(graph)[rank]
    gpu = args.device != "cpu"
    aware = False
    if gpu:
        import torch

        from hopdec.transport.mpi import cuda_aware_mpi
        torch.cuda.set_device(rank % torch.cuda.device_count())
        aware = args.cuda_aware_mpi == "yes" or (args.cuda_aware_mpi == "auto" and bool(cuda_aware_mpi()))
        if rank == 0:
            print(f"GPU path: {torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
                  f"{MPI.Get_library_version().splitlines()[0][:60]}; MPI buffers "
                  f"{'on the device (CUDA-aware)' if aware else 'staged through pinned host memory'}",
                  file=sys.stderr if args.json else sys.stdout, flush=True)
        if args.ablation:
            raise SystemExit("--ablation is CPU-only")
    if args.ablation:
        ablation(comm, view, args.ablation, reps=args.reps, warmup=3, timed=args.timed, max_ig=args.max_ig)
        return 0
    variants = ["hopdec", "bare"] + ([] if args.no_busy else ["hopdec-busy"])
    rows = []
    t_all = clock()
    load_before = os.getloadavg()
    for item in args.plan.split(","):
        mb, warmup, timed, reps = item.split(":")
        mb, warmup, timed, reps = float(mb), max(int(warmup), 1), int(timed), int(reps)
        n = int(mb * 2 ** 20) // 4
        rng = np.random.default_rng(rank)
        params = rng.standard_normal(n).astype(np.float32)
        if gpu:
            params = torch.from_numpy(params).cuda()
            rbufs = acc = tmp = None
        else:
            rbufs = {j: np.zeros(n, dtype=np.float32) for j in view.in_neighbors}
            acc, tmp = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.float32)
        res = {v: [] for v in variants}
        parts = {v: [] for v in variants}
        for rep in range(reps):
            order = variants if rep % 2 == 0 else variants[::-1]   # alternate who goes first
            for v in order:
                if v == "bare" and gpu:
                    s, cpu, params = cuda_bare(comm, view, params, warmup, timed, aware)
                    pr = {"cpu": cpu}
                elif v == "bare":
                    s, cpu, params, acc = run_bare(comm, view, params, rbufs, acc, tmp, warmup,
                                                   timed)
                    pr = {"cpu": cpu}
                else:
                    s, pr, params = run_hopdec(comm, view, params, warmup, timed, args.max_ig,
                                               busy=v == "hopdec-busy", aware=aware)
                    if gpu:
                        params = params.clone()          # a tensor of its own for the next round
                    else:
                        acc = np.empty_like(params)
                # mean over ranks of this round
                allr = comm.allgather((s, pr))
                res[v].append(statistics.mean(a for a, _ in allr))
                if pr:
                    parts[v].append({k: statistics.mean(b[k] for _, b in allr) for k in pr})
        if rank == 0:
            med = {v: statistics.median(res[v]) * 1e3 for v in variants}
            bd = {k: statistics.median(d[k] for d in parts["hopdec"]) * 1e3
                  for k in parts["hopdec"][0]}
            bd["bare_cpu"] = statistics.median(d["cpu"] for d in parts["bare"]) * 1e3
            low = {v: min(res[v]) * 1e3 for v in variants}
            rows.append((mb, med, bd, low, f"{warmup}+{timed}x{reps}"))
            print(f"  [{mb:g} MB: " + ", ".join(f"{v} {res[v] and [round(x * 1e3, 1) for x in res[v]]}"
                                                for v in variants) + " ms/iter per rep]", flush=True,
                  file=sys.stderr if args.json else sys.stdout)
        del rbufs, params, acc, tmp
    if rank == 0 and args.json:
        print(json.dumps(as_json(rows, variants, args, size, clock() - t_all, load_before)))
    elif rank == 0:
        print(f"\nexchange on {os.path.basename(args.topology)}, {size} ranks, hopdec tokens max_ig "
              f"{args.max_ig}; ms/iter = mean over ranks, median over interleaved reps (min over reps "
              f"in brackets); both sides include the same {'torch reduce on the GPU' if gpu else 'numpy reduce'}; "
              f"total {clock() - t_all:.0f} s")
        hdr = (f"{'MB':>4} {'warm+timed x reps':>17} {'hopdec':>16} {'bare':>16} {'ratio':>6} "
               f"{'(min)':>6}" + (f" {'busy':>16} {'busy/bare':>9}" if "hopdec-busy" in variants else "")
               + f" | hopdec ms: {'copy':>6} {'reduce':>6} {'wait':>7} {'rest':>6}"
               + f" | CPU ms/rank: {'hopdec':>6} {'bare':>6}")
        print(hdr)
        print("-" * len(hdr))
        def cell(v):
            return f"{med[v]:.1f} [{low[v]:.1f}]"

        for mb, med, bd, low, plan in rows:
            line = (f"{mb:>4g} {plan:>17} {cell('hopdec'):>16} {cell('bare'):>16} "
                    f"{med['hopdec'] / med['bare']:>6.2f} {low['hopdec'] / low['bare']:>6.2f}")
            if "hopdec-busy" in variants:
                line += f" {cell('hopdec-busy'):>16} {med['hopdec-busy'] / med['bare']:>9.2f}"
            rest = med["hopdec"] - bd["fill"] - bd["reduce"] - bd["wait"]
            line += (f" | {'':>10}{bd['fill']:>6.2f} {bd['reduce']:>6.2f} {bd['wait']:>7.2f} "
                     f"{rest:>6.2f} | {'':>12}{bd['cpu']:>6.2f} {bd['bare_cpu']:>6.2f}")
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
