"""The decentralized mechanisms at scale (no paper has it): standard, backup workers, bounded staleness and
skipping on 16 to 1024 workers, timing only -- which settings win as n grows?

    python3 experiments/repro_scale.py                  # ~4.5 min of wall time on 2 shared cores
    python3 experiments/repro_scale.py --quick          # 16 and 64 workers, short runs (seconds)
    python3 experiments/repro_scale.py --report-only    # the tables again, from the cache
    python3 experiments/repro_scale.py --print-commands

All times are simulated (virtual) seconds. Setting: Hop's experiment scaled up (``repro_hop.py``'s costs):
the ring-based graph (Hop Fig. 11: a ring plus an edge to the most distant node, degree 3 at every n),
VGG-11's 37.2 MiB messages, 1.5 s of compute per iteration, every worker on its own 10 Gb/s NIC (no
machines; 3 sends per iteration take ~0.09 s), latency 50 us. Three kinds of heterogeneity:

* **random 6x, prob 1/n** -- Hop's definition (sec. 7.3.1): about one slowed worker per iteration in the
  whole cluster, whatever n;
* **random 6x, prob 1/16** -- the per-worker rate of Hop's 16-worker runs kept as n grows: at 1024
  workers ~64 slowed workers in every iteration;
* **one 4x straggler** (rank 0, as Hop Figs. 18-19).

Mechanisms: standard, backup 1, staleness 5, backup 1 + skip (max-jump=10, trigger=2); max_ig 4 under
random slowdowns, 10 with the straggler (as ``repro_hop.py``). Figures: the job's iterations per virtual
second (150 iterations / the virtual time until the last worker finished them; what a user waits for),
and the median worker's steady-state rate (iterations 15-150; skipped iterations count as progress). They
differ where the median worker runs far ahead of a slow one for a while: a worker at distance d from
the straggler may be up to d x max_ig iterations ahead of it, and ring-based 1024 has a diameter of 256,
far more than the run -- in the long run everyone is paced by the slowest (Theorem 1).

Fidelity: timing only -- iteration speed, not convergence: backup workers and staleness make an
iteration worth less (Hop Fig. 15), so a speed-up here is an upper bound on the gain in time to
accuracy. One seed (1) per setting.
"""

from dataclasses import dataclass

import repro_common as C

VGG11_MB = 37.22
COMPUTE_S = 1.5
HETERO = (("random 6x, prob 1/n", ["--slowdown", "random:factor=6,prob=1/n"], 4),
          ("random 6x, prob 1/16", ["--slowdown", "random:factor=6,prob=1/16"], 4),
          ("one 4x straggler", ["--slowdown", "rank=0,factor=4"], 10))
MECHS = (("standard", []), ("backup 1", ["--backup-workers", "1"]), ("staleness 5", ["--staleness", "5"]),
         ("backup 1 + skip", ["--backup-workers", "1", "--skip", "max-jump=10,trigger=2"]))


@dataclass(frozen=True)
class Cfg:
    ns: tuple = (16, 64, 256, 1024)
    iterations: int = 150


FULL = Cfg()
QUICK = Cfg(ns=(16, 64), iterations=60)


def argv(n, iterations, extra, max_ig, seed=1):
    return ["--topology", "ring-based", "-n", n, "--message-mb", VGG11_MB, "--compute-time", COMPUTE_S,
            "--bandwidth", 10, "--iterations", iterations, "--max-ig", max_ig, "--seed", seed,
            "--invariants", "off"] + list(extra)


def job_rate(fig, iterations):
    """Iterations per virtual second of the whole job: until its last worker finished."""
    return iterations / fig["virtual_s"]


def winner(row_rates):
    """The mechanism with the highest rate (ties: the first, i.e. the simplest)."""
    best = None
    for name, r in row_rates:
        if r is not None and (best is None or r > best[1] * (1 + 1e-9)):
            best = (name, r)
    return best[0] if best else "-"


def main(argv_=None, out=None):
    """Run the study; returns the :class:`repro_common.Report` (its tables as printed)."""
    S = C.Session(__doc__, "scale", argv_, out, "16 and 64 workers, short runs")
    args, rep = S.args, S.rep
    cfg = QUICK if args.quick else FULL
    run = S.run
    none = {n: run(argv(n, cfg.iterations, [], 4)) for n in cfg.ns}
    summary = []
    for hi, (hlabel, hetero, max_ig) in enumerate(HETERO):
        rep.h(f"Scale, timing only: {hlabel}, ring-based, max_ig {max_ig}, {cfg.iterations} iterations")
        rep.p("Each cell: the job's it/s (iterations / virtual time until the last worker finished) / the "
              "median worker's steady-state it/s (in brackets: job it/s vs standard).\n")
        rows = []
        for n in cfg.ns:
            figs = {m: run(argv(n, cfg.iterations, hetero + extra, max_ig)) for m, extra in MECHS}
            job = {m: job_rate(f, cfg.iterations) for m, f in figs.items()}
            cells = [f"n={n}", f"{C.fmt(job_rate(none[n], cfg.iterations))} / {C.fmt(none[n]['rate_med'])}"]
            for m, _ in MECHS:
                cells.append(f"{C.fmt(job[m])} / {C.fmt(figs[m]['rate_med'])} ({C.ratio(job[m], job['standard'])})")
            w = winner([(m, job[m]) for m, _ in MECHS])
            cells += [w, C.ratio(job[w], job_rate(none[n], cfg.iterations)), max(figs[m]["gap"] for m, _ in MECHS)]
            rows.append(cells)
            summary.append([hlabel, f"n={n}", w, C.ratio(job[w], job["standard"])])
        rep.table(f"scale_{hi}", ["n", "no slowdown"] + [m for m, _ in MECHS] +
                  ["fastest job", "fastest vs no slowdown", "largest gap"], rows)
    rep.h("Scale: the fastest mechanism per setting")
    rep.table("winners", ["heterogeneity", "n", "fastest job", "its speed-up vs standard"], summary)
    return S.finish()


if __name__ == "__main__":
    main()
