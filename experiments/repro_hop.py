"""Hop (Luo et al.) sec. 7 reproduced in the simulator: Figs. 12-21 on the paper's cluster, simulated.

    python3 experiments/repro_hop.py                   # every part, ~2.5 min of wall time on 2 shared cores
    python3 experiments/repro_hop.py --only fig18      # one part: fig12 fig13 fig16 fig18 fig20 sens
    python3 experiments/repro_hop.py --quick           # one seed, short runs (~30 s; rough figures)
    python3 experiments/repro_hop.py --report-only     # the tables again, from the cache
    python3 experiments/repro_hop.py --print-commands  # + every hopdec sim command line

All times are simulated (virtual) seconds. The paper's cluster (sec. 7.2): 16 workers on 4 machines (4
workers each, consecutive ranks), 1 Gb/s Ethernet, VGG-11 on CIFAR-10 with batch 128 on CPUs. What the
simulator is given, and why:

* **Message**: hopdec's ``vgg11`` for CIFAR-10, 9,756,426 parameters x 4 B = 37.2 MiB (timing-only runs
  use ``--model vgg11 --dataset cifar10``, whose real size is the message; ``--math`` runs train the
  digits ``mlp`` and send ``--message-mb 37.22``).
* **Compute**: not in the paper. VGG-11 on a 32x32 image is ~153 M multiply-adds forward, ~0.92 GFLOP
  forward+backward; x128 = ~117 GFLOP per iteration. A 2016-era 2-socket Xeon machine sustains a few
  hundred GFLOP/s in TensorFlow on convolutions; a quarter of it (4 workers per machine) ~75 GFLOP/s:
  **1.5 s per iteration**. The sensitivity part repeats the key figures at 0.5 and 4.5 s.
* **Network**: every machine has one 1 Gb/s NIC that its workers share for what leaves or enters it,
  and its workers exchange through shared memory (the topology's node attributes ``machine`` and
  ``bandwidth``: the simulator's machines, since 2026-11-25; before, each edge between machines got a
  static share of the machine NIC). Latency 50 us. The PS of Fig. 13 is "one additional machine": server NIC 1 Gb/s, each worker 0.25 Gb/s
  (a quarter of its machine's NIC).
* **Heterogeneity** (sec. 7.3): ``--slowdown random:factor=6,prob=1/n`` (Figs. 12, 14-17) and
  ``--slowdown rank=0,factor=4`` (Figs. 18-19). Fig. 20: 8 workers on 3 machines of 4, 2, 2.
* **max_ig**: not in the paper; 4 for the random slowdown (as ``experiments/hetero.py``), 10 for the
  straggler (a straggler jumps at most max_ig), swept in the sensitivity part.

Fidelity: "timing" tables are timing-only simulations (iteration speed, gaps; 500 iterations per
worker, steady state). "--math" tables train the digits ``mlp`` (one hidden layer of 128, 9,610
parameters, its presets lr 0.05, momentum 0.9, batch 32; 1437 training and 360 test images) in every
simulated worker, with the VGG-11 message size and compute time above: time-to-accuracy is real
optimisation of a small model with the paper's model *costs*, not VGG-11's accuracy (the paper plots
VGG-11 loss curves). Seeds 1-3, median.
"""

import argparse
import os
import statistics
from dataclasses import dataclass

import repro_common as C

from hopdec import topology as T
from hopdec.sim.network import LinkModel
from hopdec.topology.analysis import metropolis_gap
from hopdec.topology.traffic import traffic

VGG11_MB = 37.22                 # 9,756,426 x 4 B in MiB
COMPUTE_S = 1.5
MACHINE_GBPS = 1.0
LOCAL_GBPS = 10.0
RANDOM = "random:factor=6,prob=1/n"
STRAGGLER = "rank=0,factor=4"
MATH_MODEL = "mlp"
TOPO_DIR = "/tmp/hopdec_repro/topologies"


@dataclass(frozen=True)
class Cfg:
    seeds: tuple = (1, 2, 3)
    it_timing: int = 500         # iterations per worker, timing-only runs
    it_math: int = 150           # iterations per worker, --math runs
    eval_every: float = 10.0     # virtual seconds between evaluations of the average model


FULL = Cfg()
QUICK = Cfg(seeds=(1,), it_timing=80, it_math=60)


# ---- the cluster: machines behind one NIC -----------------------------------------------------------
def machine_topology(kind, n, sizes, path):
    """``kind`` on n workers placed on machines of ``sizes`` (consecutive ranks: node attribute ``machine``),
    each machine's NIC ``MACHINE_GBPS`` (node attribute ``bandwidth``: the simulator gives a machine's
    workers one NIC, and shared memory inside); written to ``path``. Returns (path, cross-machine edges
    out of each machine, into each)."""
    machines = tuple(sizes)
    G = T.GENERATORS[kind](n, machines)
    per = traffic(G, LinkModel())["per_host"]
    out_c, in_c = ([per[f"m{m}"][k] for m in range(len(machines))] for k in (0, 1))
    for v in G.nodes:
        G.nodes[v]["bandwidth"] = MACHINE_GBPS
    os.makedirs(os.path.dirname(path), exist_ok=True)
    T.save(G, path)
    return path, out_c, in_c


def topo16(kind):
    return machine_topology(kind, 16, (4, 4, 4, 4), f"{TOPO_DIR}/{kind.replace('-', '_')}_16_4x4.json")[0]


class Part:
    """One part of the reproduction: its runs (through the cached runner), its settings, its report."""

    def __init__(self, runner, cfg, report, show_cmds=False):
        self.R, self.cfg, self.rep, self.show = runner, cfg, report, show_cmds
        self.cmds = []

    def run(self, argv):
        self.cmds.append(C.cmd(argv))
        return self.R.run(argv)

    def runs(self, argvs):
        return [self.run(a) for a in argvs]

    def commands(self):
        if self.show:
            self.rep.p("\n" + "\n".join("    " + c for c in self.cmds))
        self.cmds = []

    # ---- command lines ----
    def timing(self, topo, extra, compute=COMPUTE_S, seed=1, max_ig=4):
        return ["--topology", topo, "--model", "vgg11", "--dataset", "cifar10", "--bandwidth", LOCAL_GBPS,
                "--compute-time", compute, "--iterations", self.cfg.it_timing, "--max-ig", max_ig,
                "--seed", seed, "--invariants", "off"] + list(extra)

    def math(self, topo, extra, seed, compute=COMPUTE_S, max_ig=4):
        return ["--topology", topo, "--math", "--model", MATH_MODEL, "--message-mb", VGG11_MB,
                "--bandwidth", LOCAL_GBPS, "--compute-time", compute, "--iterations", self.cfg.it_math,
                "--max-ig", max_ig, "--seed", seed, "--eval-interval", self.cfg.eval_every,
                "--invariants", "off"] + list(extra)

    def ps_bsp(self, seed, math_=False):
        a = ["--sync", "bsp", "-n", 16, "--compute-time", COMPUTE_S, "--seed", seed,
             "--bandwidth", "0@1", "--bandwidth", "1-16@0.25", "--invariants", "off"]
        if math_:
            return a + ["--iterations", self.cfg.it_math, "--math", "--model", MATH_MODEL,
                        "--message-mb", VGG11_MB, "--eval-interval", 3 * self.cfg.eval_every]
        return a + ["--iterations", max(20, self.cfg.it_timing // 5), "--model", "vgg11", "--dataset", "cifar10"]

    def math_runs(self, topo, extra, **kw):
        return self.runs([self.math(topo, extra, s, **kw) for s in self.cfg.seeds])

    def timing_runs(self, topo, extra, **kw):
        return self.runs([self.timing(topo, extra, seed=s, **kw) for s in self.cfg.seeds])


def med(figs, key):
    vals = [f[key] for f in figs if f.get(key) is not None]
    return statistics.median(vals) if vals else None


# ---- Fig. 12: random slowdown on three graphs --------------------------------------------------------
def fig12(P):
    P.rep.h("Fig. 12: effect of a random 6x slowdown (prob 1/16) on three graphs (timing, 16 workers)")
    rows = []
    for net, net_args in (("1 Gb/s machines", []), ("network free (compute only)", ["--bandwidth", "inf"])):
        for kind in ("ring", "ring-based", "double-ring"):
            t = topo16(kind) if not net_args else kind
            extra = net_args + (["-n", 16] if net_args else [])
            base = P.run(P.timing(t, extra))
            slow = P.timing_runs(t, ["--slowdown", RANDOM] + extra)
            r_slow = med(slow, "rate_med")
            rows.append([f"{net}, {kind}", C.fmt(base["rate_med"]), C.fmt(r_slow),
                         C.ratio(base["rate_med"], r_slow), f"{base['gap']} / {max(f['gap'] for f in slow)}"])
    P.rep.table("fig12", ["network, graph", "it/s no slowdown", "it/s random 6x", "slowdown costs",
                          "largest gap (none / slow)"], rows)
    P.rep.p("\nPaper: none of the graphs is immune; sparser graphs suffer less (Fig. 12: loss curves, no numbers).")
    P.commands()


# ---- Fig. 13: decentralized vs PS BSP ------------------------------------------------------------------
def fig13(P):
    P.rep.h("Fig. 13: decentralized (ring-based) vs parameter server BSP, 16 workers")
    t = topo16("ring-based")
    homo = P.run(P.timing(t, []))
    het = P.timing_runs(t, ["--slowdown", RANDOM])
    ps = P.run(P.ps_bsp(1))
    rows = [["decentralized ring-based, homogeneous", C.fmt(1 / homo["rate_med"]), C.fmt(homo["rate_med"])],
            ["decentralized ring-based, random 6x", C.fmt(1 / med(het, "rate_med")), C.fmt(med(het, "rate_med"))],
            ["PS BSP (1 server machine), homogeneous", C.fmt(1 / ps["rate_med"]), C.fmt(ps["rate_med"])]]
    P.rep.p("Timing:\n")
    P.rep.table("fig13_timing", ["setting", "s per iteration", "it/s"], rows)
    dec_h = P.math_runs(t, [])
    dec_s = P.math_runs(t, ["--slowdown", RANDOM])
    psm = P.runs([P.ps_bsp(s, math_=True) for s in P.cfg.seeds])
    P.rep.p(f"\n--math (digits {MATH_MODEL} with VGG-11 costs, {P.cfg.it_math} iterations, seeds "
            f"{_seeds(P.cfg)}, median):\n")
    rows = []
    for name, figs in (("decentralized, homogeneous", dec_h), ("decentralized, random 6x", dec_s),
                       ("PS BSP, homogeneous", psm)):
        t90, t95 = C.median_time_to(figs, 0.9), C.median_time_to(figs, 0.95)
        rows.append([name, C.fmt(t90), C.fmt(t95), C.fmt(med(figs, "avg_acc")), C.fmt(med(figs, "virtual_s"))])
    P.rep.table("fig13_math", ["setting", "time to acc 0.90 (s)", "time to acc 0.95 (s)", "final acc",
                               "run (virtual s)"], rows)
    ps90 = C.median_time_to_range(psm, 0.9)
    P.rep.p(f"\n{C.grid_note(P.cfg.eval_every)} PS BSP is evaluated every {C.fmt(3 * P.cfg.eval_every)} s "
            f"(its iterations are 6x longer).")
    P.rep.p(f"\nPS BSP / decentralized time to 0.90: homogeneous "
            f"{C.range_ratio(ps90, C.median_time_to_range(dec_h, 0.9))}, random 6x "
            f"{C.range_ratio(ps90, C.median_time_to_range(dec_s, 0.9))}. Paper: decentralized, homogeneous or "
            f"not, converges much faster than homogeneous PS (loss curves, no numbers).")
    P.commands()


def _seeds(cfg):
    return ",".join(map(str, cfg.seeds))


# ---- Figs. 14-17: backup workers and staleness under random slowdown ---------------------------------
SETTINGS = (("standard", []), ("backup 1", ["--backup-workers", "1"]), ("staleness 5", ["--staleness", "5"]),
            ("hybrid (backup 1 + staleness 5)", ["--backup-workers", "1", "--staleness", "5"]))


def fig16(P):
    P.rep.h("Figs. 14-17: backup workers and bounded staleness, random 6x slowdown (prob 1/16), max_ig 4")
    P.rep.p(f"Timing ({P.cfg.it_timing} iterations, seeds {_seeds(P.cfg)}, median of the median worker's "
            f"steady-state it/s):\n")
    rows = []
    for kind in ("ring-based", "double-ring"):
        t = topo16(kind)
        none = P.run(P.timing(t, []))
        std = None
        for name, extra in SETTINGS:
            figs = P.timing_runs(t, ["--slowdown", RANDOM] + extra)
            r = med(figs, "rate_med")
            std = r if std is None else std
            rows.append([f"{kind}, {name}", C.fmt(r), C.ratio(r, std), C.ratio(r, none["rate_med"]),
                         max(f["gap"] for f in figs)])
    P.rep.table("fig16_timing", ["graph, setting", "it/s", "speed-up vs standard", "vs no slowdown",
                                 "largest gap"], rows)
    P.rep.p(f"\n--math on ring-based (digits {MATH_MODEL}, VGG-11 costs, {P.cfg.it_math} iterations, seeds "
            f"{_seeds(P.cfg)}, median):\n")
    t = topo16("ring-based")
    rows = []
    std90 = None
    for name, extra in SETTINGS:
        figs = P.math_runs(t, ["--slowdown", RANDOM] + extra)
        t90, t95 = C.median_time_to(figs, 0.9), C.median_time_to(figs, 0.95)
        r90 = C.median_time_to_range(figs, 0.9)
        std90 = r90 if std90 is None else std90
        rows.append([name, C.fmt(t90), C.range_ratio(std90, r90), C.fmt(t95), C.fmt(med(figs, "avg_acc"))])
    P.rep.table("fig16_math", ["setting", "time to acc 0.90 (s)", "speed-up", "time to acc 0.95 (s)",
                               "final acc"], rows)
    P.rep.p(f"\n{C.grid_note(P.cfg.eval_every)}")
    P.rep.p("\nPaper: backup workers and staleness 5 both beat the standard setting on wall-clock time; "
            "iteration speed-up \"up to 1.81\" (Figs. 16-17).")
    P.commands()


# ---- Figs. 18-19: a deterministic 4x straggler, skipping ---------------------------------------------
STRAG = (("no slowdown (standard)", []), ("standard", ["--slowdown", STRAGGLER]),
         ("backup 1", ["--slowdown", STRAGGLER, "--backup-workers", "1"]),
         ("backup 1 + skip max-jump=2", ["--slowdown", STRAGGLER, "--backup-workers", "1", "--skip",
                                         "max-jump=2,trigger=2"]),
         ("backup 1 + skip max-jump=10", ["--slowdown", STRAGGLER, "--backup-workers", "1", "--skip",
                                          "max-jump=10,trigger=2"]))


def fig18(P):
    P.rep.h("Figs. 18-19: one 4x straggler (rank 0) on ring-based 16, max_ig 10")
    t = topo16("ring-based")
    rows = []
    base = None
    for name, extra in STRAG:
        f = P.run(P.timing(t, extra, max_ig=10))
        base = f["iter_s"] if base is None else base
        rows.append([name, C.fmt(f["iter_s"]), C.ratio(f["iter_s"], base), C.fmt(f["rate_med"]), f["jumps"],
                     f["gap"]])
    P.rep.p(f"Timing ({P.cfg.it_timing} iterations; mean iteration duration over workers, steady state):\n")
    P.rep.table("fig18_timing", ["setting", "mean iteration (s)", "vs no slowdown", "it/s (median worker)",
                                 "jumps", "largest gap"], rows)
    P.rep.p(f"\n--math (digits {MATH_MODEL}, VGG-11 costs, {P.cfg.it_math} iterations, seeds {_seeds(P.cfg)}, "
            f"median):\n")
    res = {name: P.math_runs(t, extra, max_ig=10) for name, extra in STRAG}
    r90 = {name: C.median_time_to_range(figs, 0.9) for name, figs in res.items()}
    rows = []
    for name, _ in STRAG:
        figs = res[name]
        t90, t95 = C.median_time_to(figs, 0.9), C.median_time_to(figs, 0.95)
        rows.append([name, C.fmt(t90), C.range_ratio(r90["standard"], r90[name]), C.fmt(t95),
                     C.fmt(med(figs, "avg_acc"))])
    P.rep.table("fig18_math", ["setting", "time to acc 0.90 (s)", "speed-up vs standard", "time to acc 0.95 (s)",
                               "final acc"], rows)
    P.rep.p(f"\n{C.grid_note(P.cfg.eval_every)}")
    P.rep.p("\nPaper: the straggler makes an iteration 3.9x longer; skipping brings it to 3.90/3.43 = 1.14x "
            "(Fig. 18); max-jump=10 converges fastest, more than 2x faster than standard (Fig. 19).")
    P.commands()


# ---- Figs. 20-21: topologies on 8 workers over 3 machines --------------------------------------------
def fig20(P):
    P.rep.h("Figs. 20-21: ring-based vs the hierarchical graphs, 8 workers on 3 machines (4, 2, 2)")
    rows = []
    topos = {}
    for kind in ("ring-based", "hierarchical-a", "hierarchical-b"):
        path, out_c, in_c = machine_topology(kind, 8, (4, 2, 2), f"{TOPO_DIR}/{kind.replace('-', '_')}_8_422.json")
        topos[kind] = path
        G = T.load(path)
        rows.append([kind, f"{T.spectral_gap(G):.4f}", f"{T.normalized_laplacian_gap(G):.4f}",
                     f"{metropolis_gap(G):.4f}", ",".join(map(str, out_c))])
    P.rep.p("Spectral gaps (`hopdec topo analyze`): footnote 2 = |l1(W)| - |l2(W)| with eq. (1) weights; "
            "normalized Laplacian = 1 - l2 of the random walk without self-loops (the definition that gives "
            "the paper's printed numbers):\n")
    P.rep.table("fig21_gaps", ["graph", "gap (footnote 2)", "gap (normalized Laplacian)", "gap (Metropolis W)",
                               "cross-machine edges out of m0,m1,m2"], rows)
    P.rep.p("\nPaper (Fig. 21): 0.6667, 0.2682, 0.2688.")
    hetero_compute = ["--compute-time", "0-3@3.0"]      # 4 workers share machine 0: half the CPU each
    for tag, label, extra in (("net", "network only (same compute everywhere, 1.5 s)", []),
                              ("netcpu", "network + compute (machine 0's four workers 2x slower: 3.0 s)",
                               hetero_compute)):
        rows = []
        for kind, path in topos.items():
            f = P.run(P.timing(path, extra, max_ig=4))
            figs = P.math_runs(path, extra)
            it90 = statistics.median(C.iters_to(f2, 0.9) or float("inf") for f2 in figs)
            rows.append([kind, C.fmt(f["iter_s"]), C.fmt(f["rate_min"]), C.fmt(C.median_time_to(figs, 0.9)),
                         C.fmt(C.median_time_to(figs, 0.95)), C.fmt(it90), C.fmt(med(figs, "avg_acc"))])
        P.rep.p(f"\n{label}; timing ({P.cfg.it_timing} iterations) and --math (digits {MATH_MODEL}, VGG-11 "
                f"costs, {P.cfg.it_math} iterations, seeds {_seeds(P.cfg)}, median):\n")
        P.rep.table(f"fig20_{tag}", ["graph", "mean iteration (s)", "slowest it/s", "time to 0.90 (s)",
                                     "time to 0.95 (s)", "mean iteration at 0.90", "final acc"], rows)
        P.rep.p(f"\n{C.grid_note(P.cfg.eval_every, 'Times and iterations at an accuracy', ratios=False)}")
    P.rep.p("\nPaper: the hierarchical graphs, with much smaller spectral gaps, converge faster in time than "
            "ring-based; no significant difference per iteration (Fig. 20).")
    P.commands()


# ---- sensitivity: what the unstated settings do --------------------------------------------------------
def sens(P):
    P.rep.h("Sensitivity: backup/staleness speed-up and the straggler's cost vs compute time and max_ig "
            f"(timing, ring-based 16, {P.cfg.it_timing} iterations)")
    t = topo16("ring-based")
    rows = []
    for compute in (0.5, 1.5, 4.5):
        for max_ig in (2, 4, 10):
            kw = dict(compute=compute, max_ig=max_ig)
            std = P.timing_runs(t, ["--slowdown", RANDOM], **kw)
            b1 = P.timing_runs(t, ["--slowdown", RANDOM, "--backup-workers", "1"], **kw)
            s5 = P.timing_runs(t, ["--slowdown", RANDOM, "--staleness", "5"], **kw)
            none = P.run(P.timing(t, [], **kw))
            rows.append([f"{compute} s, max_ig {max_ig}", C.fmt(none["iter_s"]), C.fmt(1 / med(std, "rate_med")),
                         C.ratio(med(b1, "rate_med"), med(std, "rate_med")),
                         C.ratio(med(s5, "rate_med"), med(std, "rate_med"))])
    P.rep.table("sens_random", ["compute, max_ig", "iteration s, no slowdown", "iteration s, random 6x",
                                "backup 1 speed-up", "staleness 5 speed-up"], rows)
    rows = []
    for compute in (0.5, 1.5, 4.5):
        base = P.run(P.timing(t, [], compute=compute, max_ig=10))
        cells = [f"{compute} s", C.fmt(base["iter_s"])]
        for name, extra in STRAG[1:]:
            f = P.run(P.timing(t, extra, compute=compute, max_ig=10))
            cells.append(C.ratio(f["iter_s"], base["iter_s"]))
        rows.append(cells)
    P.rep.p()
    P.rep.table("sens_straggler", ["compute", "iteration s, no slowdown"] + [f"{n} (vs none)" for n, _ in STRAG[1:]],
                rows)
    P.commands()


PARTS = dict(fig12=fig12, fig13=fig13, fig16=fig16, fig18=fig18, fig20=fig20, sens=sens)


def main(argv=None, out=None):
    """Run the parts asked for; returns the :class:`repro_common.Report` (its tables as printed)."""
    ap = C.common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]), "hop")
    ap.add_argument("--only", choices=sorted(PARTS), action="append", help="run only this part (repeatable)")
    args = ap.parse_args(argv)
    R = C.Runner(args.cache, report_only=args.report_only, fresh=args.fresh)
    rep = C.Report(out)
    P = Part(R, QUICK if args.quick else FULL, rep, args.print_commands)
    if args.quick:
        rep.p("(--quick: one seed, short runs; rough figures)")
    for name in args.only or PARTS:
        PARTS[name](P)
    rep.p("\n" + C.footer(R))
    return rep


if __name__ == "__main__":
    main()
