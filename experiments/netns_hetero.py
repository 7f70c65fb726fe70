"""Hop sec. 7's heterogeneous-network experiments, for real, on emulated links (hopdec.testbed).

    python3 experiments/netns_hetero.py [--only fig21,graphs,ps-thin,ps-control] [--iterations N] [--out DIR]
                                        [--report-only] [--quick]

Every run is a real ``hopdec train`` (8 MPI ranks, mlp on digits, compute padded to 0.05 s) launched
through ``launch/hostfile.sh`` across network namespaces on this machine (one testbed per group, its
links measured first), and the same configuration in ``hopdec sim`` with the testbed's NICs, links and
delays. The links are EMULATED: htb for bandwidth, a userspace forwarder for delay, all hosts sharing
this machine's CPUs; the conditions are in every run's log header and in the tables.

* ``fig21`` (Hop Figs. 20-21): 8 workers on 3 machines (4, 2, 2: the topologies' ``machine``
  attribute), ranks of a machine over shared memory, machines joined through NICs of 10 Mbit/s with
  1 ms each way: ring-based against the two hierarchical graphs (all-reduce inside a machine, a ring
  between machines), with and without a random 6x slowdown.
* ``graphs`` (Hop Figs. 11-12): ring, ring-based, double-ring; 8 hosts of one worker, NICs of 20 Mbit/s,
  2 ms each way; without slowdown and with a random 6x slowdown (probability 1/n).
* ``ps-thin`` (Hop Fig. 13, with a thin server link): 1 server + 7 workers, one per host, workers' NICs
  100 Mbit/s, the server's 20 Mbit/s; BSP, ASP, backup workers, against decentralized ring-based on the
  same 8 hosts; ``ps-control``: BSP with the server's NIC at 100 Mbit/s too (``--only ps``: both).

The simulator's model is the testbed's (:func:`hopdec.testbed.spec.sim_topology`): one NIC per host, which
a machine's ranks share (``fig21``: node attribute ``machine``, shared memory inside), links with their
delays. Writes ``DIR/results.json``; prints markdown tables.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hopdec.testbed import validate as V  # noqa: E402
from hopdec.testbed.spec import Link, by_machine, by_rank, sim_topology  # noqa: E402
from hopdec.topology import graph_io  # noqa: E402

COMPUTE = ["--model", "mlp", "--compute-time", "0.05", "--seed", "1"]
SLOW = ["--slowdown", "random:factor=6,prob=1/n"]
BASE_LATENCY = 5e-5


GROUPS = ("fig21", "graphs", "ps-thin", "ps-control")
"""The groups of runs, in their order (:func:`groups`); ``--only ps`` names the last two."""


def chosen_groups(only):
    """The groups ``--only`` names (comma-separated; ``ps`` is both PS groups), in their order; ValueError
    naming any unknown one."""
    names = [n.strip() for n in str(only).split(",") if n.strip()]
    unknown = [n for n in names if n not in GROUPS and n != "ps"]
    if unknown or not names:
        raise ValueError(f"--only {only}: {', '.join(unknown) or 'nothing'} is not a group of "
                         f"{', '.join(GROUPS)} (or ps: both PS groups)")
    want = set(names) | ({"ps-thin", "ps-control"} if "ps" in names else set())
    return [g for g in GROUPS if g in want]


def clear_groups(out, names):
    """Remove what earlier runs of the groups ``names`` wrote in ``out`` -- their folders and run lists,
    and the tables -- and nothing else (``--out`` may be a folder of the user's own)."""
    for name in names:
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    for f in [f"runs_{n}.json" for n in names] + ["results.json", "conditions.json"]:
        try:
            os.remove(os.path.join(out, f))
        except FileNotFoundError:
            pass


def topo(name):
    return os.path.join(ROOT, "topologies", f"{name}.json")


def with_machines(src, machines_from, path):
    """``src`` with the ``machine`` attributes of ``machines_from`` (same ranks), written to ``path``."""
    G = graph_io.load(src)
    M = graph_io.load(machines_from)
    for v in G:
        G.nodes[v]["machine"] = M.nodes[v]["machine"]
    graph_io.save(G, path)
    return path


def groups(out, iterations):
    """[(group, testbed spec, [(run name, train argv, sim extra)])]."""
    hier = topo("hierarchical_a_8")
    rb_m = with_machines(topo("ring_based_8"), hier, os.path.join(out, "ring_based_8_machines.json"))
    fig21 = []
    for slow in ([], SLOW):
        for name, path in (("ring-based", rb_m), ("hierarchical-a", hier), ("hierarchical-b", topo("hierarchical_b_8"))):
            tag = name + ("+slow6x" if slow else "")
            fig21.append((tag, ["--topology", path, "--max-ig", "4"] + slow, {}))
    graphs = []
    for slow in ([], SLOW):
        for name in ("ring_8", "ring_based_8", "double_ring_8"):
            tag = name.replace("_8", "").replace("_", "-") + ("+slow6x" if slow else "")
            graphs.append((tag, ["--topology", topo(name), "--max-ig", "4"] + slow, {}))
    ps_runs = [("ps-bsp", ["--mode", "ps", "--sync", "bsp"], {}),
               ("ps-asp", ["--mode", "ps", "--sync", "asp"], {}),
               ("ps-backup1", ["--mode", "ps", "--sync", "backup", "--backup-workers", "1"], {}),
               ("decentralized ring-based", ["--topology", topo("ring_based_8"), "--max-ig", "4"], {})]
    G8 = graph_io.load(topo("ring_based_8"))
    return [
        ("fig21", by_machine(graph_io.load(hier), nic_mbit=10.0, cross=Link(None, 1.0)), fig21),
        ("graphs", by_rank(G8, nic_mbit=20.0, cross=Link(None, 2.0)), graphs),
        ("ps-thin", by_rank(G8, nic_mbit=100.0, server_mbit=20.0), ps_runs),
        ("ps-control", by_rank(G8, nic_mbit=100.0), ps_runs[:1]),
    ]


def run_group(out, name, spec, runs, iterations, timeout):
    from hopdec.testbed.netns import NetnsTestbed
    argvs = [["--no-progress", "--threads", "1", "--iterations", str(iterations), "--log-dir",
              os.path.join(out, name, tag)] + COMPUTE + argv for tag, argv, _ in runs]
    path = os.path.join(out, f"runs_{name}.json")
    with open(path, "w") as f:
        json.dump(argvs, f)
    drv = os.path.join(out, "driver.py")
    with open(drv, "w") as f:
        f.write(V.DRIVER)
    t0 = time.time()
    with NetnsTestbed(spec) as tb:
        tb.measure()
        proc = tb.run(spec.ranks, cmd=f"{sys.executable} {drv} {path}", timeout=timeout)
        cond = tb.conditions()
        measured = tb.describe_measured()
    if proc.returncode:
        sys.exit(f"group {name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, name, "stdout.txt"), "w") as f:
        f.write(proc.stdout)
    print(f"{name}: {len(runs)} runs in {time.time() - t0:.0f} s\n{spec.describe()}\n{measured}", flush=True)
    return cond


def accuracies(stdout):
    """The averaged model's test accuracy of each run, in order (from the summaries)."""
    return [float(line.rsplit(" ", 1)[1]) for line in stdout.splitlines()
            if line.startswith(("averaged model: test loss", "server model: test loss"))]


def simulate(out, name, spec, tag, argv, iterations):
    """The run in ``hopdec sim`` with the testbed's network."""
    import io

    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate as sim_run
    log = os.path.join(out, name, "sim_" + tag)
    a = ["--iterations", str(iterations), "--invariants", "off", "--log-dir", log] + COMPUTE + list(argv)
    if "--mode" in argv:                     # PS: server rank 0, workers 1..7; NICs per rank
        a += ["-n", str(spec.ranks - 1), "--latency", str(BASE_LATENCY)]
        for r, h in enumerate(spec.hosts):
            if h.nic_mbit is not None:
                a += ["--bandwidth", f"{r}@{h.nic_mbit / 1e3:g}"]
    else:
        i = a.index("--topology") + 1
        G = graph_io.load(a[i])
        path = os.path.join(out, name, f"simtopo_{tag}.json")
        graph_io.save(sim_topology(G, spec, BASE_LATENCY), path)
        a[i] = path
        a += ["--latency", str(BASE_LATENCY + max((lk.delay_ms for lk in spec.links.values()), default=0) / 1e3)]
        # one rank per host: TCP, the mlp's 38 KB messages are eager (64 KiB, the default). Ranks sharing
        # a host exchange over shared memory (eager 4 KiB, then taken by the receiver): the simulator has
        # one eager limit, and takes that one (the messages between hosts, eager in reality, still travel
        # at once; only their completion is then counted when taken)
        if any(h.slots > 1 for h in spec.hosts):
            a += ["--eager-limit", "4096", "--rendezvous", "take"]
    sim_run(parse(a), out=io.StringIO())
    return log


def slowest(log_dir):
    """Iterations/s of the slowest worker (from iteration SKIP on) and the run's mean iteration time."""
    from hopdec.runtime.metrics import read_log
    rates = []
    for r in range(8):
        p = os.path.join(log_dir, f"rank{r}.jsonl")
        if not os.path.exists(p):
            continue
        recs = [x for x in read_log(p) if x["iter"] >= V.SKIP]
        if len(recs) >= 2:
            rates.append((recs[-1]["iter"] - recs[0]["iter"]) / (recs[-1]["time"] - recs[0]["time"]))
    return min(rates), statistics.median(rates)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(GROUPS), help="groups to run (default: all)")
    ap.add_argument("--iterations", type=int, default=80)
    ap.add_argument("--out", default="/tmp/hopdec_netns_hetero")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--quick", action="store_true", help="30 iterations (a smoke test)")
    args = ap.parse_args(argv)
    iterations = 30 if args.quick else args.iterations
    try:
        wanted = chosen_groups(args.only)
    except ValueError as err:
        ap.error(str(err))
    if args.report_only:
        missing = [n for n in wanted if not os.path.exists(os.path.join(args.out, n, "stdout.txt"))]
        if missing:
            ap.error(f"--report-only: {args.out} has no runs of {', '.join(missing)} (run them first, or "
                     f"leave them out with --only)")
    else:
        clear_groups(args.out, wanted)
    os.makedirs(args.out, exist_ok=True)
    results = {}
    saved = os.path.join(args.out, "conditions.json")
    conds = json.load(open(saved)) if args.report_only and os.path.exists(saved) else {}
    for name, spec, runs in groups(args.out, iterations):
        if name not in wanted:
            continue
        if not args.report_only:
            conds[name] = run_group(args.out, name, spec, runs, iterations, args.timeout)
            with open(saved, "w") as f:
                json.dump(conds, f)
        stdout = open(os.path.join(args.out, name, "stdout.txt")).read()
        accs = accuracies(stdout)
        rows = []
        for k, (tag, argv_, _) in enumerate(runs):
            real = V.metrics(os.path.join(args.out, name, tag))
            rslow, _ = slowest(os.path.join(args.out, name, tag))
            slog = simulate(args.out, name, spec, tag, argv_, iterations)
            sim = V.metrics(slog)
            sslow, _ = slowest(slog)
            rows.append(dict(run=tag, real_rate=real["rate"], real_slowest=rslow, sim_rate=sim["rate"],
                             sim_slowest=sslow, acc=accs[k] if k < len(accs) else None,
                             real_gap=real["gap"], sim_gap=sim["gap"],
                             real_wait_sends_ms=real["wait_sends_s"] * 1e3, sim_wait_sends_ms=sim["wait_sends_s"] * 1e3))
        results[name] = dict(rows=rows, conditions=conds.get(name))
        print_table(name, spec, rows, conds.get(name))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


def print_table(name, spec, rows, cond):
    print(f"\n#### {name}: {spec.describe().splitlines()[0]}")
    for line in spec.describe().splitlines()[1:]:
        print(f"- {line.strip()}")
    for m in (cond or {}).get("measured", []):
        c = m["configured"]
        print(f"- measured {m['src']}->{m['dst']}: {m['mbit']:.1f} Mbit/s (configured "
              f"{'-' if c['mbit'] is None else format(c['mbit'], 'g')}), RTT median {m['rtt_ms_median']:.2f} ms "
              f"(configured {c['rtt_ms']:g})")
    print("\n| run | real it/s (median worker) | slowest | simulated it/s | slowest | error | test acc | gap real/sim |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = "-" if r["acc"] is None else f"{r['acc']:.3f}"
        print(f"| {r['run']} | {r['real_rate']:.2f} | {r['real_slowest']:.2f} | {r['sim_rate']:.2f} | "
              f"{r['sim_slowest']:.2f} | {r['sim_rate'] / r['real_rate'] - 1:+.1%} | {acc} | "
              f"{r['real_gap']}/{r['sim_gap']} |")


if __name__ == "__main__":
    main()
