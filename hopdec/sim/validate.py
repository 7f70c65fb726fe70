"""The simulator against real runs: the same small configurations under ``mpirun`` and in ``hopdec sim``.

Used by the validation test (``tests/test_sim_mpi.py``) and by ``experiments/validate_sim.py``, which
measured the tolerances. Every case is one set of options that both ``hopdec train`` (8 MPI ranks) and
``hopdec sim`` accept; both write the same logs, and :func:`metrics` reads either:

* ``rate``: iterations per second of each worker from its log (records from iteration ``SKIP`` on, so
  start-up is left out), the median over workers;
* ``gap``: the largest iteration gap observed (the logs' replay, as the summary computes it).

What is compared are *ratios* of rates between cases (e.g. backup workers over standard) and the gaps:
a real run on this machine is slower than the simulation in absolute terms (8 ranks share 2 cores:
polling, the real compute of the model, the message copies), but both slow down and speed up alike.
"""

import glob
import json
import os
import statistics

from hopdec.runtime.metrics import read_log

RANKS = 8
"""Every case runs on 8 MPI ranks: 8 workers (decentralized), or 1 server + 7 workers (PS)."""
SKIP = 5
COMPUTE = "0.05"
COMMON = ["--model", "mlp", "--compute-time", COMPUTE, "--seed", "1"]
DEC = ["--topology", "topologies/ring_based_8.json", "--max-ig", "4", "--slowdown", "random:factor=6,prob=1/n"]
PS = ["--mode", "ps", "--slowdown", "rank=3,factor=3"]
CASES = {
    "standard": DEC,
    "backup": DEC + ["--backup-workers", "1"],
    "staleness": DEC + ["--staleness", "3"],
    "ps-bsp": PS + ["--sync", "bsp"],
    "ps-backup": PS + ["--sync", "backup", "--backup-workers", "1"],
}
RATIOS = (("backup", "standard"), ("staleness", "standard"), ("ps-backup", "ps-bsp"))
"""The throughput ratios compared (numerator, denominator)."""


def train_argv(case, iterations, log_dir):
    """``hopdec train`` options of a case (run it under ``mpirun -n RANKS``)."""
    return ["--no-progress", "--threads", "1", "--iterations", str(iterations), "--log-dir", str(log_dir)] + \
        COMMON + CASES[case]


def sim_argv(case, iterations, log_dir=None, latency=None):
    """``hopdec sim`` options of the same case (``-n`` for the PS mode's workers)."""
    argv = ["--iterations", str(iterations)] + COMMON + CASES[case]
    if case.startswith("ps-"):
        argv += ["-n", str(RANKS - 1)]
    if log_dir is not None:
        argv += ["--log-dir", str(log_dir)]
    if latency is not None:
        argv += ["--latency", str(latency)]
    return argv


def metrics(log_dir):
    """``rate`` (median iterations/s over workers, from iteration SKIP on) and ``gap`` of a run's logs."""
    from hopdec.report.gaps import largest_gap
    logs = []
    for path in sorted(glob.glob(os.path.join(str(log_dir), "rank*.jsonl"))):
        recs = read_log(path)
        if recs:
            logs.append(recs)
    rates = []
    for recs in logs:
        part = [r for r in recs if r["iter"] >= SKIP]
        if len(part) >= 2 and part[-1]["time"] > part[0]["time"]:
            rates.append((part[-1]["iter"] - part[0]["iter"]) / (part[-1]["time"] - part[0]["time"]))
    gap = largest_gap([[(r["time"], r["iter"]) for r in recs] for recs in logs])
    return dict(rate=statistics.median(rates), gap=gap, workers=len(logs))


def ratios(m):
    """The RATIOS of a ``{case: metrics}`` dict."""
    return {f"{a}/{b}": m[a]["rate"] / m[b]["rate"] for a, b in RATIOS if a in m and b in m}


def header(log_dir):
    with open(os.path.join(str(log_dir), "rank1.jsonl")) as f:
        return json.loads(f.readline())["run"]


DRIVER = """
import json, sys
if sys.argv[2] == "copy":
    # the transport's copying send path (a ring of send buffers): the default zero-copy sends make
    # Reduce wait until the previous sends were received, which over shared memory happens only when
    # the receiver next polls -- a transport effect the simulator does not model (experiments/README.md)
    from hopdec.ml.trainer import LocalTrainer
    LocalTrainer.use_send_storage = lambda self, length, on_device=False: False
from hopdec.cli.train import main
for argv in json.loads(sys.argv[1]):
    rc = main(argv)
    if rc:
        sys.exit(rc)
"""
"""One MPI job for many runs: ``python DRIVER RUNS_JSON copy|zero-copy`` calls ``hopdec train`` per run."""
