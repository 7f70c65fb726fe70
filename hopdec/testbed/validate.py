"""The simulator against real runs: the same configurations under ``mpirun`` and in ``hopdec sim``.

Used by ``experiments/validate_sim.py`` (which measured the agreement) and the validation test
(``tests/test_sim_mpi.py``). Real runs take the **default** code path (zero-copy sends; nothing is
patched): a driver (:data:`DRIVER`) calls ``hopdec train``'s ``main`` once per case inside one MPI job.

A case is one set of options that ``hopdec train`` (8 MPI ranks) and ``hopdec sim`` both accept; both
write the same logs, which :func:`metrics` reads:

* ``rate``: iterations per second of each worker from its log (records from iteration ``SKIP`` on, so
  start-up is left out), the median over workers;
* ``gap``: the largest iteration gap observed (the logs' replay, as the summary computes it).

Cases come in *contexts* (a graph, a slowdown, max_ig, compute time, a network): a baseline (standard
decentralized, or PS BSP) and variants with a mechanism; what is compared is each variant's throughput
ratio to its baseline, real against simulated, and every case's gap and absolute rate. Contexts are
drawn at random from :data:`SPACE` (:func:`sample`, seeded) besides the hand-picked :func:`fixed` ones.

Where the real runs run: on this host (shared memory between ranks: the simulator with Open MPI's
shared-memory eager limit) or on an emulated network (:mod:`hopdec.testbed`, TCP between namespaces:
the simulator gets the testbed's NICs, link capacities and delays through :func:`sim_argv`).
"""

import glob
import json
import os
import random
import statistics
from dataclasses import dataclass, field

from hopdec.runtime.metrics import read_log

RANKS = 8
"""Every case runs on 8 MPI ranks: 8 workers (decentralized), or 1 server + 7 workers (PS)."""
SKIP = 5
COMPUTE = "0.05"
COMMON = ["--model", "mlp", "--compute-time", COMPUTE]


@dataclass
class Case:
    """One run: ``argv`` (options shared by train and sim, without ``--seed``), its ``seed``; ``base``:
    the name of the case it is compared with (None: it is a baseline); ``topology``: the file the real
    run trains on (the simulator gets it annotated with the network, see :func:`sim_argv`)."""

    name: str
    argv: list
    seed: int = 1
    base: str = None
    topology: str = None
    context: dict = field(default_factory=dict)

    @property
    def ps(self):
        return "--mode" in self.argv and self.argv[self.argv.index("--mode") + 1] == "ps"


# ---- the hand-picked cases --------------------------------------------------------------------------
def fixed(topo_dir="topologies"):
    """The hand-picked cases: ring_based_8 with a random 6x slowdown (standard, backup 1, staleness 3,
    max_ig 4); the audit's torus 2x4 with a 4x straggler, max_ig 3, backup or staleness with skipping
    (where the zero-copy effect is largest); a PS with a 3x straggler (BSP, backup 1)."""
    rb = os.path.join(topo_dir, "ring_based_8.json")
    dec = ["--topology", rb, "--max-ig", "4", "--slowdown", "random:factor=6,prob=1/n"]
    torus = ["--topology", "torus", "--max-ig", "3", "--slowdown", "rank=2,factor=4"]
    ps = ["--mode", "ps", "--slowdown", "rank=3,factor=3"]
    return [
        Case("standard", dec, topology=rb),
        Case("backup", dec + ["--backup-workers", "1"], base="standard", topology=rb),
        Case("staleness", dec + ["--staleness", "3"], base="standard", topology=rb),
        Case("torus", torus),
        Case("torus-backup-skip", torus + ["--backup-workers", "1", "--skip", "max-jump=3,trigger=2"], base="torus"),
        Case("torus-stale-skip", torus + ["--staleness", "3", "--skip", "max-jump=3,trigger=2"], base="torus"),
        Case("ps-bsp", ps + ["--sync", "bsp"]),
        Case("ps-backup", ps + ["--sync", "backup", "--backup-workers", "1"], base="ps-bsp"),
    ]


# ---- configurations drawn at random -----------------------------------------------------------------
SPACE = dict(
    graphs=["ring_8", "ring_based_8", "double_ring_8", "exponential_8", "hierarchical_a_8",
            "hierarchical_b_8", "torus", "random"],
    max_ig=[2, 3, 4],
    slowdowns=["random:factor=6,prob=1/n", "random:factor=3,prob=1/n", "rank={r},factor=4",
               "rank={r},factor=2", "none"],
    mechanisms=["backup-workers 1", "staleness 2", "staleness 5", "backup-workers 1 +skip",
                "staleness 3 +skip", "protocol queue-only", "protocol notify-ack"],
    ps_syncs=["backup --backup-workers 1", "ssp --staleness 3", "asp", "dssp", "elastic"],
    ps_share=0.25,
)
"""The space :func:`sample` draws from: graphs (shipped files, the 2x4 torus, a random strongly
connected directed graph), max_ig, slowdowns (a random slowdown of probability 1/n, a deterministic
straggler on a random rank, none), mechanisms compared with standard; a quarter of the contexts are
parameter servers (BSP against another sync model, a straggler)."""


def random_graph(rng, n, path):
    """A random strongly connected directed graph on ``n`` nodes (a random Hamiltonian cycle plus random
    edges until every node has at least two in-neighbours and there are 2n edges), eq. (1) weights,
    written to ``path``."""
    import networkx as nx

    from hopdec.topology import graph_io
    from hopdec.topology.weights import with_default_weights
    order = list(range(n))
    rng.shuffle(order)
    G = nx.DiGraph()
    G.add_nodes_from(range(n))
    G.add_edges_from((order[i], order[(i + 1) % n]) for i in range(n))
    while G.number_of_edges() < 2 * n or min(d for _, d in G.in_degree()) < 2:
        a, b = rng.sample(range(n), 2)
        G.add_edge(a, b)
    G.add_edges_from((v, v) for v in range(n))
    G.graph["name"] = f"random_{n}"
    graph_io.save(with_default_weights(G), path)
    return path


def sample(seed, contexts, topo_dir="topologies", work_dir=".", space=SPACE):
    """``contexts`` contexts drawn with ``random.Random(seed)``: each a baseline and one variant."""
    rng = random.Random(seed)
    cases = []
    for c in range(contexts):
        cseed = rng.randrange(1, 1000)
        r = rng.randrange(1, RANKS)
        slow = rng.choice(space["slowdowns"]).format(r=r)
        slow_argv = [] if slow == "none" else ["--slowdown", slow]
        tag = f"c{seed}.{c}"
        if rng.random() < space["ps_share"]:
            if slow == "none" or slow.startswith("random"):
                slow_argv = ["--slowdown", f"rank={r},factor={rng.choice([2, 3, 4])}"]
            sync = rng.choice(space["ps_syncs"]).split()
            ctx = dict(kind="ps", slowdown=slow_argv[1], sync=" ".join(sync))
            base = ["--mode", "ps"] + slow_argv
            cases.append(Case(f"{tag}-bsp", base + ["--sync", "bsp"], cseed, context=ctx))
            cases.append(Case(f"{tag}-{sync[0]}", base + ["--sync"] + sync, cseed, base=f"{tag}-bsp", context=ctx))
            continue
        g = rng.choice(space["graphs"])
        if g == "torus":
            topo = "torus"
        elif g == "random":
            topo = random_graph(rng, RANKS, os.path.join(work_dir, f"random_{tag}.json"))
        else:
            topo = os.path.join(topo_dir, f"{g}.json")
        max_ig = rng.choice(space["max_ig"])
        mech = rng.choice(space["mechanisms"])
        ctx = dict(kind="decentralized", graph=g, max_ig=max_ig, slowdown=slow, mechanism=mech)
        base = ["--topology", topo] + slow_argv
        tokens = ["--max-ig", str(max_ig)]
        words = mech.replace("+skip", "").split()
        extra = [f"--{words[0]}", words[1]]
        if words[0] != "protocol":                  # (a protocol without token queues has no max_ig)
            extra = tokens + extra
        if "+skip" in mech:
            extra += ["--skip", f"max-jump={max_ig},trigger=2"]
        file_topo = topo if topo.endswith(".json") else None
        cases.append(Case(f"{tag}-standard", base + tokens, cseed, topology=file_topo, context=ctx))
        cases.append(Case(f"{tag}-{mech.replace(' ', '').replace('+', '-')}", base + extra, cseed,
                          base=f"{tag}-standard", topology=file_topo, context=ctx))
    return cases


# ---- command lines ----------------------------------------------------------------------------------
def train_argv(case, iterations, log_dir):
    """``hopdec train`` options of a case (run it under ``mpirun -n RANKS``)."""
    return ["--no-progress", "--threads", "1", "--iterations", str(iterations), "--log-dir", str(log_dir),
            "--seed", str(case.seed)] + COMMON + case.argv


def sim_argv(case, iterations, log_dir=None, latency=None, eager=None, topology=None, bandwidth=(),
             rendezvous=None):
    """``hopdec sim`` options of the same case: ``-n``, the simulator's ``--latency``, ``--eager-limit``,
    ``--rendezvous`` (take: shared memory, push: TCP); ``topology``: a file to simulate instead of the
    case's (the same graph annotated with the network: :func:`hopdec.testbed.spec.sim_topology`);
    ``bandwidth``: ``--bandwidth`` values (e.g. a PS server's thin NIC, ``0@0.01``)."""
    argv = (["--iterations", str(iterations), "--seed", str(case.seed), "--invariants", "off"] + COMMON
            + list(case.argv))
    if topology is not None:
        argv[argv.index("--topology") + 1] = str(topology)
    argv += ["-n", str(RANKS - 1 if case.ps else RANKS)]
    if log_dir is not None:                         # (a fit re-simulates into the same directory)
        argv += ["--log-dir", str(log_dir), "--overwrite"]
    if latency is not None:
        argv += ["--latency", str(latency)]
    if eager is not None and not case.ps:           # (a PS run's sends have no eager limit to model)
        argv += ["--eager-limit", str(eager)]
    if rendezvous is not None and not case.ps:
        argv += ["--rendezvous", rendezvous]
    for b in bandwidth:
        argv += ["--bandwidth", str(b)]
    return argv


def simulate_case(case, iterations, log_dir, **kw):
    import io

    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    simulate(parse(sim_argv(case, iterations, log_dir, **kw)), out=io.StringIO())
    return metrics(log_dir)


# ---- what is compared -------------------------------------------------------------------------------
def metrics(log_dir):
    """``rate`` (median iterations/s over workers, from iteration SKIP on), ``gap``, ``workers`` and the
    mean ``wait_sends_s`` per iteration (the zero-copy completion wait) of a run's logs."""
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
    recs = [r for lg in logs for r in lg]
    sends = sum(r.get("wait_sends_s", 0.0) for r in recs) / max(len(recs), 1)
    return dict(rate=statistics.median(rates), gap=gap, workers=len(logs), wait_sends_s=sends)


def compare(cases, real, sim):
    """One row per case: real and simulated rate, the rate error, gaps; for variants also the ratio to
    the baseline, real and simulated, and the ratio error (sim / real - 1)."""
    rows = []
    for c in cases:
        if c.name not in real or c.name not in sim:
            continue
        r, s = real[c.name], sim[c.name]
        row = dict(case=c.name, real_rate=r["rate"], sim_rate=s["rate"], rate_err=s["rate"] / r["rate"] - 1,
                   real_gap=r["gap"], sim_gap=s["gap"], real_wait_sends_s=r["wait_sends_s"],
                   sim_wait_sends_s=s["wait_sends_s"], context=c.context, argv=c.argv, seed=c.seed)
        if c.base is not None and c.base in real and c.base in sim:
            row["real_ratio"] = r["rate"] / real[c.base]["rate"]
            row["sim_ratio"] = s["rate"] / sim[c.base]["rate"]
            row["ratio_err"] = row["sim_ratio"] / row["real_ratio"] - 1
        rows.append(row)
    return rows


def header(log_dir):
    with open(os.path.join(str(log_dir), "rank1.jsonl")) as f:
        return json.loads(f.readline())["run"]


DRIVER = """
import json, sys
from hopdec.cli.train import main
for argv in json.load(open(sys.argv[1])):
    rc = main(argv)
    if rc:
        sys.exit(rc)
"""
"""One MPI job for many runs: ``python DRIVER RUNS.json`` calls ``hopdec train`` once per argv in the
file, on the default code path (nothing patched)."""


# ---- emulated networks (hopdec.testbed) -------------------------------------------------------------
NET_SPACE = dict(nic=[None, 200.0, 50.0, 20.0], delay_ms=[0.0, 2.0, 5.0], cross=[20.0, 10.0],
                 server=[20.0, 10.0, 5.0], eager=[None, 4096])
"""What :func:`sample_network` draws from: every host's NIC (Mbit/s, None: unshaped), one-way delay of
every link, the links between machines of a hierarchical graph (Mbit/s, slower), a PS server's NIC, and
Open MPI's TCP eager limit (None: its default 64 KiB, above the mlp's 38 KB messages: sends complete at
once; 4096: rendezvous, the zero-copy completion effect across the network)."""


def graph_of(case):
    """The topology a case trains on (a PS case: 8 nodes, no edges that matter)."""
    import networkx as nx

    from hopdec.topology import generators, graph_io
    if case.ps:
        G = nx.DiGraph()
        G.add_nodes_from(range(RANKS))
        return G
    topo = case.argv[case.argv.index("--topology") + 1]
    return graph_io.load(topo) if topo.endswith(".json") else generators.GENERATORS[topo](RANKS, None)


def sample_network(rng, case, space=NET_SPACE):
    """(testbed, eager limit or None) for a context drawn with ``rng``: one host per rank (the simulator's
    model), a NIC and a delay for every host; a hierarchical graph's links between machines slower; a PS
    server's NIC thin."""
    from hopdec.testbed.spec import Link, by_rank
    G = graph_of(case)
    nic, delay, eager = rng.choice(space["nic"]), rng.choice(space["delay_ms"]), rng.choice(space["eager"])
    if case.ps:
        return by_rank(G, nic, Link(None, delay), Link(None, delay), server_mbit=rng.choice(space["server"])), eager
    has_machines = any("machine" in G.nodes[v] for v in G)
    cross = Link(rng.choice(space["cross"]) if has_machines else None, delay)
    return by_rank(G, nic, cross, Link(None, delay)), eager


def sim_network(case, testbed, work_dir, base_latency_s, delay_s=None):
    """The simulator's options for a case on ``testbed`` (one host per rank): its topology annotated with
    the links (decentralized), or ``--bandwidth`` per node and ``--latency`` (PS, whose links are all
    alike). ``delay_s``: the one-way delay of every delayed link as measured (half the round trip), in
    place of the configured one. Returns keyword arguments for :func:`sim_argv`."""
    from dataclasses import replace

    from hopdec.testbed.spec import sim_topology
    from hopdec.topology import graph_io
    if delay_s is not None:
        testbed = replace(testbed, links={k: replace(lk, delay_ms=delay_s * 1e3) if lk.delay_ms else lk
                                          for k, lk in testbed.links.items()})
    if case.ps:
        bw = [f"{r}@{h.nic_mbit / 1e3:g}" for r, h in enumerate(testbed.hosts) if h.nic_mbit is not None]
        delay = testbed.link(0, 1).delay_ms / 1e3
        return dict(bandwidth=bw, latency=base_latency_s + delay)
    H = sim_topology(graph_of(case), testbed, base_latency_s)
    path = os.path.join(work_dir, f"simtopo_{case.name}.json")
    graph_io.save(H, path)
    # (control messages -- token grants -- travel against the edges; links without an edge get --latency)
    return dict(topology=path, latency=base_latency_s + testbed.link(0, 1).delay_ms / 1e3)


def fit_latency(rate_at, real_rate, lo=0.0, hi=0.02, steps=8):
    """The simulator latency (base latency per message, seconds) at which a simulated baseline runs as
    fast as the real one: bisection on ``rate_at(latency) -> iterations/s`` (which falls as the latency
    grows) within [lo, hi]. What it absorbs is this machine's cost per message -- Python, MPI and the
    waits' polling on shared cores, ~2.5 ms with 8 ranks on 2 cores -- not a network property. Fitted on
    a baseline, it is used to predict that baseline's *variants*."""
    if rate_at(lo) <= real_rate:
        return lo
    if rate_at(hi) >= real_rate:
        return hi
    for _ in range(steps):
        mid = (lo + hi) / 2
        if rate_at(mid) > real_rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
