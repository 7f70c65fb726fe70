"""``hopdec topo``: generate, analyze and compare communication graphs.

    hopdec topo generate KIND -n N [--machines 4,2,2] [--weights hop|metropolis] -o FILE
    hopdec topo analyze FILE [--max-ig K] [--staleness S] [--json] [--plot OUT.png] [NETWORK]
    hopdec topo compare A B ... [--max-ig K] [--json] [NETWORK]

NETWORK: ``--message-mb``, ``--bandwidth``, ``--latency``, ``--nic-duplex`` as ``hopdec sim`` takes them,
for the network section (:mod:`hopdec.topology.traffic`).

Bad input raises :class:`hopdec.errors.HopdecError`; ``hopdec.cli`` prints it as one line.
"""

import argparse
import json
import math
import sys

from hopdec import topology as T
from hopdec.errors import ConfigError
from hopdec.cli.helpfmt import Parser
from hopdec.cli.options import add_network_arguments
from hopdec.settings.protocol import MAX_MAX_IG
from hopdec.settings.work import MAX_ITERATIONS
from hopdec.topology.analysis import DEFAULT_MAX_IG, _num
from hopdec.topology.schedule import schedule_of
from hopdec.topology.schedule_analysis import report_lines as schedule_report_lines
from hopdec.topology.schedule_analysis import summarize_any as summarize
from hopdec.topology.traffic import host_name, traffic

PLOT_MAX_N = 1000
"""Largest graph ``--plot`` draws (it needs every eigenvalue, and a drawing of more is unreadable)."""


class _Parser(Parser):
    help_option = "-h"


def _int_at_least(lo, what, hi=None):
    """An argparse type: an integer >= ``lo`` (and <= ``hi``), with a one-line error otherwise."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < lo or (hi is not None and v > hi):
            up_to = "" if hi is None else f" up to {hi:,}"
            raise argparse.ArgumentTypeError(f"expected a {what} integer{up_to}, got {text!r}")
        return v
    return parse


_positive_int = _int_at_least(1, "positive")
_nonneg_int = _int_at_least(0, "non-negative")
_max_ig = _int_at_least(1, "positive", hi=MAX_MAX_IG)            # (the bounds train and sim check)
_staleness = _int_at_least(0, "non-negative", hi=MAX_ITERATIONS)


def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        v = None
    if v is None or not 0 < v < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _message_mb(text):
    """``--message-mb``: positive and at most hopdec sim's largest (1e307 made the transfer time infinite,
    and --json printed a bare Infinity that JSON readers refuse)."""
    from hopdec.settings.cost import MAX_MESSAGE_MB
    v = _positive_float(text)
    if v > MAX_MESSAGE_MB:
        raise argparse.ArgumentTypeError(f"at most {MAX_MESSAGE_MB:g} MiB (as hopdec sim), got {text!r}")
    return v


def _network_options(p):
    """The network of the traffic figures: the options ``hopdec sim`` takes for it, read the same way."""
    n = p.add_argument_group("network (the least transfer time per iteration, hopdec.topology.traffic)")
    n.add_argument("--message-mb", type=_message_mb, default=1.0, metavar="MIB",
                   help="MiB (2^20 bytes) per update, as hopdec sim's --message-mb (default 1; the transfer "
                        "time scales with it)")
    add_network_arguments(n)
    n.add_argument("--machines", type=_sizes, metavar="SIZES",
                   help="place the workers on machines of these sizes, in node order (e.g. 4,2,2: nodes 0-3 "
                        "on m0, 4-5 on m1, 6-7 on m2), instead of the file's 'machine' attributes: compare "
                        "graphs on the same machines")


def _traffic(G, args):
    """:func:`hopdec.topology.traffic.traffic` of ``G`` on the network the options describe."""
    from hopdec.settings.cost import Cost
    from hopdec.sim.run import link_model
    cost = Cost(bandwidth=tuple(args.bandwidth or ()), latency=args.latency, nic_duplex=args.nic_duplex)
    link = link_model(cost, G.number_of_nodes(), G)
    try:
        t = traffic(G, link, args.message_mb, args.machines)
    except ValueError as err:
        raise ConfigError(f"{G.graph.get('source') or 'topology'}: {err}") from None
    return dict(t, network=link.describe())


def _traffic_lines(t):
    """The analyze report's network section."""
    b = t["busiest"]
    hosts = ("machines, whose workers share a NIC" if t["hosts_are"] == "machines"
             else "every worker its own")
    lines = ["", f"Network (one update per edge and iteration; hosts: {hosts})",
             f"  updates               {_fmt(t['updates_per_iteration'])} per iteration, "
             f"{_fmt(t['updates_between_hosts'])} between hosts"
             + (f" (busiest: {host_name(b['host'])} sends {b['sends']}, receives {b['receives']})" if b else "")]
    if t["seconds_per_iteration"]:
        lines += [f"  transfer time         >= {_ms(t['seconds_per_iteration'])} per iteration for updates of "
                  f"{t['message_mb']:g} MiB: at most {t['max_iterations_per_s']:.4g} it/s, whatever the compute",
                  f"                        ({t['bottleneck']})"]
    else:
        lines.append(f"  transfer time         none ({t['bottleneck']})")
    lines.append(f"  links                 {t['network']}")
    if t["largest_latency_s"] is not None:
        lines.append(f"  largest latency       {t['largest_latency_s']:g} s per message between hosts")
    return lines


def _networks(rows):
    """The network of every row, once, or a pointer where the files' attributes make them differ."""
    nets = {s["traffic"]["network"] for s in rows}
    return nets.pop() if len(nets) == 1 else ("the files' bandwidth and latency attributes differ: "
                                               "hopdec topo analyze shows each")


def _ms(seconds):
    return f"{seconds * 1e3:.4g} ms"


def _sizes(text):
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated machine sizes like 4,2,2, "
                                         f"got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"machine sizes must be positive, got {text!r}")
    return sizes


def build_parser():
    p = _Parser(prog="hopdec topo", description="Build and study communication graphs "
                "(Hop: iteration-gap bounds of Table 1, spectral gap, queue sizes).")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="write a generated graph as node-link JSON")
    g.add_argument("kind", choices=sorted(T.GENERATORS), help="graph family; hierarchical-a/-b "
                   "are Hop Fig. 21 (b)/(c): " + "; ".join(
                       f"{k}: {v}" for k, v in T.HIERARCHICAL_VARIANTS.items()))
    g.add_argument("-n", type=_positive_int, help="number of workers (optional for the "
                   "hierarchical kinds when --machines is given)")
    g.add_argument("--machines", type=_sizes, metavar="SIZES",
                   help="workers per machine, consecutive nodes on each, e.g. 4,2,2 (node attribute "
                        "'machine': a machine's workers share its NIC in hopdec sim and topo analyze; the "
                        "hierarchical kinds' default for n: n/2, n/4, n/4)")
    g.add_argument("--weights", choices=["hop", "metropolis"], default="hop",
                   help="hop: Hop eq. (1), W_ij = 1/|N_in(j)| with the self-loop counted "
                        "(column-stochastic); metropolis: Metropolis-Hastings, W_ij = "
                        "1/(1+max(deg i, deg j)), doubly stochastic (symmetric graphs only)")
    g.add_argument("-o", "--output", required=True, metavar="FILE", help="the JSON file to write")

    a = sub.add_parser("analyze", help="report a graph's properties and Hop Table 1 bounds")
    a.add_argument("file", help="a topology file: node-link JSON or an edge list (src dst [weight])")
    a.add_argument("--max-ig", type=_max_ig, default=DEFAULT_MAX_IG, metavar="K",
                   help=f"token-queue max iteration gap for the token rows (default "
                        f"{DEFAULT_MAX_IG})")
    a.add_argument("--staleness", type=_staleness, metavar="S",
                   help="bounded staleness s: adds the (s+1)*len rows")
    a.add_argument("--local-steps", type=_positive_int, default=1, metavar="H",
                   help="rounds of H local steps (hopdec train --local-steps): the bounds count rounds; "
                        "says each in inner steps too (default 1)")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--plot", metavar="OUT.png", help="draw the graph and W's eigenvalue moduli "
                   f"(graphs of up to {PLOT_MAX_N} nodes)")
    _network_options(a)

    c = sub.add_parser("compare", help="key figures of several graphs side by side")
    c.add_argument("files", nargs="+", help="topology files (node-link JSON or edge lists)")
    c.add_argument("--max-ig", type=_max_ig, default=DEFAULT_MAX_IG, metavar="K",
                   help=f"max_ig for the token-gap column (default {DEFAULT_MAX_IG})")
    c.add_argument("--json", action="store_true", help="print a JSON list, one object per file")
    _network_options(c)
    return p


def main(argv):
    args = build_parser().parse_args(list(argv))
    if args.cmd == "generate":
        return _generate(args)
    if args.cmd == "analyze":
        return _analyze(args)
    return _compare(args)


# ----------------------------------------------------------------------------------------------

def _generate(args):
    from hopdec.cli.report import output_path
    output_path(args.output, option="generate -o")   # (before any work: an empty name, a missing folder)
    if args.n is None and not (args.kind.startswith("hierarchical") and args.machines):
        raise ConfigError(f"generate: -n is required for kind {args.kind}")
    try:
        G = T.GENERATORS[args.kind](args.n, machines=args.machines)
        if args.weights == "metropolis" and schedule_of(G) is not None:
            raise ValueError("a schedule's steps keep eq. (1) weights (one-peer steps are already doubly "
                             "stochastic)")
        if args.weights == "metropolis":
            G = T.metropolis_weights(G)
    except ValueError as err:
        raise ConfigError(f"generate {args.kind}" + (" --weights metropolis" if args.weights ==
                          "metropolis" else "") + f": {err}") from None
    T.save(G, args.output)          # (whole or not at all; a write refused: one line naming the file)
    n = G.number_of_nodes()
    m = G.number_of_edges() - T.nx.number_of_selfloops(G)
    if schedule_of(G) is not None:                  # a time-varying topology (gossip)
        print(f"wrote {args.output}: {args.kind} schedule, {n} nodes, period {schedule_of(G).period} steps, "
              f"{m} union edges, Hop eq. (1) weights per step")
        return 0
    print(f"wrote {args.output}: {args.kind}, {n} node{'s' if n != 1 else ''}, {m} edge{'s' if m != 1 else ''} "
          f"(self-loops not counted), "
          f"{'Metropolis-Hastings' if args.weights == 'metropolis' else 'Hop eq. (1)'} weights")
    return 0


def _fmt(x):
    if x is None:
        return "-"
    if x == "inf" or (isinstance(x, float) and math.isinf(x)):
        return "inf"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.4f}"
    return str(x)


def _warnings(s):
    """One stderr line per thing to know about the file's weights (the same notes train prints)."""
    lines = [f"hopdec topo: warning: {note}" for note in s["weight_notes"]]
    if not s["strongly_connected"]:
        lines.append(f"hopdec topo: warning: {s['file']}: not strongly connected "
                     f"({len(s['components'])} components over edges of positive weight): "
                     f"hopdec train refuses it")
    elif s.get("spectral_gap") is not None and s["spectral_gap"] < 1e-9 and s["nodes"] > 1:
        lines.append(f"hopdec topo: warning: {s['file']}: spectral gap 0: W is periodic (a worker with no "
                     f"self-weight passes models round a cycle), so the workers' models never approach their "
                     f"average; give every worker a positive self-loop weight")
    elif not s["doubly_stochastic"]:
        lines.append(f"hopdec topo: warning: {s['file']}: W is column- but not doubly-stochastic: "
                     f"workers agree on a weighted average, not the plain mean (Hop and D-PSGD want "
                     f"doubly stochastic W; hopdec topo generate --weights metropolis gives it)")
    for line in lines:
        print(line, file=sys.stderr)


def _components(comps, shown=5, members=6):
    """``{0}, {1, 2}, {3, 4, 5, ... (40 nodes)}`` for the first few components."""
    def one(c):
        head = ", ".join(map(str, c[:members]))
        return "{" + (head if len(c) <= members else f"{head}, ... ({len(c)} nodes)") + "}"
    more = f", ... ({len(comps)} components)" if len(comps) > shown else ""
    return ", ".join(one(c) for c in comps[:shown]) + more


def _row(label, value, note):
    return f"  {label:<31}{_fmt(value):>4}   {note}"


def _rounds_note(h, more=""):
    """What ``--local-steps H`` changes in Table 1 (two lines)."""
    return (f"  with --local-steps {h} an iteration is a round of {h} inner steps: every bound below{more} "
            f"and max_ig count rounds;\n  a bound of B rounds is B*{h} inner steps between two workers' "
            f"round starts")


def _analyze(args):
    if args.plot is not None:                       # checked before the analysis, as hopdec plot's -o
        from hopdec.cli.report import figure_path
        args.plot = figure_path(args.plot, "analyze --plot")
    G = T.load(args.file, connected=False)
    if args.plot and G.number_of_nodes() > PLOT_MAX_N:
        raise ConfigError(f"analyze --plot: draws graphs of up to {PLOT_MAX_N} nodes, "
                          f"{args.file} has {G.number_of_nodes()}")
    s = summarize(G, args.max_ig, args.staleness)
    s["traffic"] = _traffic(G, args)
    h = args.local_steps
    if h > 1:                                       # Theorem 2 holds per round: the core counts rounds
        s["local_steps"] = h
        s["gap_bounds_inner_steps"] = {name: (None if v is None else v if v == "inf" or math.isinf(float(v))
                                              else v * h) for name, v in (s["gap_bounds"] or {}).items()}
    _warnings(s)
    if args.plot:
        plot(G, args.plot)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    if schedule_of(G) is not None:                  # a time-varying topology (gossip)
        lines = schedule_report_lines(s, args.max_ig, args.staleness, _fmt)
        if h > 1:                                   # (after Table 1's title, as for a static graph)
            at = next((i + 1 for i, x in enumerate(lines) if x.startswith("Hop Table 1")), len(lines))
            lines[at:at] = _rounds_note(h, ", the schedule's step").split("\n")
        print("\n".join(lines + _traffic_lines(s["traffic"])))
        return 0
    k, st = args.max_ig, args.staleness
    b = s["gap_bounds"] or {}
    sc = "yes" if s["strongly_connected"] else f"no: {_components(s['components'])}"
    mh = s["metropolis_spectral_gap"]
    lines = [
        f"{args.file}",
        f"  nodes                 {s['nodes']}",
        f"  edges                 {s['edges']} (directed, self-loops not counted)",
        f"  in-degree             {s['in_degree']['min']}..{s['in_degree']['max']} "
        f"(self-loop not counted)",
        f"  out-degree            {s['out_degree']['min']}..{s['out_degree']['max']}",
    ]
    if s["machines"]:
        lines.append("  machines              " + ", ".join(f"{m}: {c} workers"
                                                          for m, c in s["machines"].items()))
    lines += [
        f"  strongly connected    {sc}",
        f"  column-stochastic     {_fmt(s['column_stochastic'])}"
        + ("   (in-weights renormalised, see the warning)" if any(
            "do not sum to 1" in x for x in s["weight_notes"]) else ""),
        f"  doubly-stochastic     {_fmt(s['doubly_stochastic'])}",
        f"  spectral gap          {_fmt(s['spectral_gap'])}   (|l1|-|l2| of W, Hop footnote 2)",
        f"  norm. Laplacian gap   {_fmt(s['normalized_laplacian_gap'])}   (1-l2 without "
        f"self-loops; the measure behind Hop Fig. 21's numbers)",
        f"  Metropolis gap        {_fmt(mh)}   " + (
            "(spectral gap with doubly stochastic Metropolis-Hastings weights, "
            "hopdec topo generate --weights metropolis)" if mh is not None else
            "(Metropolis-Hastings weights need a symmetric graph)"),
        f"  diameter              {_fmt(s['diameter'])}",
        "",
        f"Hop Table 1: max over pairs of the bound on Iter(i)-Iter(j)  (max_ig={k}"
        + (f", s={st}" if st is not None else "") + ")" + (
            "\n" + _rounds_note(h) if h > 1 else ""),
        _row("standard (update queues)", b.get("standard"), "len(Path j->i)"),
        _row("standard + token queues", b.get("standard+tokens"), f"min(len j->i, {k}*len i->j)"),
    ]
    if st is not None:
        lines += [
            _row(f"bounded staleness s={st}", b.get("staleness"), f"({st}+1)*len j->i"),
            _row("staleness + token queues", b.get("staleness+tokens"),
                 f"min(({st}+1)*len j->i, {k}*len i->j)"),
        ]
    lines += [
        _row("backup / hybrid", b.get("backup"), "unbounded without token queues"),
        _row("backup / hybrid + token queues", b.get("backup+tokens"),
             f"{k}*len i->j (iteration skipping keeps it)"),
        _row("notify-ack", b.get("notify-ack"), "min(len j->i, 2*len i->j)"),
        "",
        f"Queues (max_ig={k})",
        f"  largest update queue  {s['update_queue_capacity']}   (1+max_ig)*|N_in(i)|, self-loop "
        f"counted as in Hop ({s['update_queue_capacity_remote']} from other workers; "
        f"without token queues: {_fmt(s['update_queue_capacity_no_tokens'])}, "
        f"sum of len(Path i->j)+1 over in-neighbours j; notify-ack: "
        f"{s['update_queue_capacity_notify_ack']}, one per in-neighbour)",
        f"  largest token queue   {_fmt(s['token_queue_capacity'])}   max_ig*(len Path i->j + 1)",
    ]
    lines += _traffic_lines(s["traffic"])
    if s["skipped"]:
        lines += ["", f"skipped: {s['skipped']}"]
    n = s["nodes"]
    if n <= 8:
        for name, B in (("standard", T.gap_bounds(G)),
                        (f"standard + token queues, max_ig={k}", T.gap_bounds(G, max_ig=k))):
            lines += ["", f"Bound on Iter(i)-Iter(j), {name} (row i, column j):",
                      "       " + "".join(f"{j:>5}" for j in range(n))]
            for i in range(n):
                lines.append(f"  {i:>3}  " + "".join(f"{_fmt(_num(B[i, j])):>5}"
                                                     for j in range(n)))
    print("\n".join(lines))
    return 0


def _compare(args):
    rows = []
    for G in [T.load(f, connected=False) for f in args.files]:
        s = summarize(G, args.max_ig)
        s["traffic"] = _traffic(G, args)
        rows.append(s)
    for s in rows:                  # (once every file passed: a later file refused is one line, no warnings)
        _warnings(s)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    cols = [("file", "file"), ("nodes", "nodes"), ("edges", "edges"), ("max_degree", "max deg"),
            ("doubly_stochastic", "doubly"), ("spectral_gap", "gap"),
            ("normalized_laplacian_gap", "lap gap"), ("diameter", "diam"),
            ("standard", "max gap"), ("standard+tokens", f"tokens(ig={args.max_ig})"),
            ("updates_between_hosts", "x-host"), ("net_ms", "net ms")]
    table = [[h for _, h in cols]]
    for s in rows:
        t = s["traffic"]
        values = dict(s, **(s["gap_bounds"] or {}), updates_between_hosts=t["updates_between_hosts"],
                      net_ms=f"{t['seconds_per_iteration'] * 1e3:.4g}")
        table.append([_fmt(values.get(k)) for k, _ in cols])
    widths = [max(len(r[c]) for r in table) for c in range(len(cols))]
    for r in table:
        print("  ".join(x.ljust(w) if c == 0 else x.rjust(w)
                        for c, (x, w) in enumerate(zip(r, widths))))
    print("edges: directed, self-loops not counted; gap: |l1|-|l2| of W (Hop footnote 2); "
          "max gap: max_ij bound on Iter(i)-Iter(j) (Hop Table 1)")
    hosts = "the machines of --machines" if args.machines else "machine attributes, else every worker its own"
    print(f"x-host: updates per iteration between hosts ({hosts}); net ms: least transfer time per iteration "
          f"through the busiest NIC or link for updates of {args.message_mb:g} MiB "
          f"({_networks(rows)})")
    if any(s.get("period") for s in rows):
        print("schedules: edges and degree of the union; gap per step, 1-|l2(W_0...W_P-1)|^(1/P); Table 1 "
              "with activation gaps")
    return 0


def plot(G, out):
    """Draw the graph coloured by ``machine`` and the sorted eigenvalue moduli of W into ``out`` (PNG, PDF, SVG:
    as its suffix says)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = G.number_of_nodes()
    machines = sorted({G.nodes[v].get("machine", "") for v in range(n)})
    cmap = plt.get_cmap("tab10")
    colors = [cmap(machines.index(G.nodes[v].get("machine", "")) % 10) for v in range(n)]
    H = T.nx.DiGraph(G)
    H.remove_edges_from(list(T.nx.selfloop_edges(H)))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5))
    pos = T.nx.circular_layout(H)
    T.nx.draw_networkx(H, pos=pos, ax=ax1, node_color=colors, with_labels=True,
                       arrows=True, node_size=350, font_size=8, arrowsize=8)
    if machines != [""]:
        from matplotlib.lines import Line2D
        ax1.legend(handles=[Line2D([], [], marker="o", ls="", color=cmap(k % 10), label=m or "-")
                            for k, m in enumerate(machines)], title="machine", fontsize=8,
                   loc="upper right")
    title = G.graph.get("source") or G.graph.get("name") or "graph"
    ax1.set_title(f"{title} ({n} nodes; colour = machine; self-loops omitted)", fontsize=9)
    ax1.set_axis_off()
    m = T.eigenvalue_moduli(G)
    ax2.plot(range(1, n + 1), m, "o-")
    ax2.set_xlabel("k (sorted by modulus)")
    ax2.set_ylabel("|lambda_k(W)|")
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_title(f"eigenvalue moduli of W; spectral gap {T.spectral_gap(G):.4f}", fontsize=9)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(out)                            # in the format its suffix names (figure_path)
        print(f"wrote {out}", file=sys.stderr)         # as hopdec plot and report say; stdout may be --json
    except OSError as err:
        raise ConfigError(f"analyze --plot: cannot write {out}: {err.strerror or err}") \
            from None
    finally:
        plt.close(fig)
