"""What one iteration puts on the network (Hop sec. 7, Figs. 20-22): where the updates go, and the least
transfer time per iteration that the hosts' NICs and the links allow.

Every worker sends one update to each out-neighbour per iteration (Hop Fig. 7; on a schedule, step k's
active edges). Workers with the same ``machine`` attribute share that host's NIC and exchange through
shared memory, as ``python -m hopdec.testbed --place machine`` and real clusters run them; a worker
without one is a host of its own. A NIC moves its bandwidth per direction (full duplex) or in all (half),
shared by what crosses it; an edge's own ``bandwidth`` caps that link (between machines: inside one,
shared memory). No schedule of the transfers ends an iteration's sends sooner than the busiest NIC or
link needs, so training cannot run faster than 1 / that time, whatever the compute: why a graph with a
smaller spectral gap wins on slow links between machines (Fig. 21). It is ``hopdec sim``'s network model
(:class:`hopdec.sim.network.LinkModel`), where the bound is reached when compute is short.

>>> import networkx as nx
>>> from hopdec.sim.network import LinkModel
>>> from hopdec.topology.traffic import traffic
>>> G = nx.DiGraph([(0, 1), (1, 0), (1, 2), (2, 1)])
>>> t = traffic(G, LinkModel(bandwidth=1e9 / 8), message_mb=1.0)     # 1 Gb/s NICs
>>> t["updates_per_iteration"], t["busiest"], round(t["seconds_per_iteration"], 5)
(4, {'host': 1, 'sends': 2, 'receives': 2}, 0.01678)
"""

from __future__ import annotations

from typing import Any, Optional

MIB = 2 ** 20
"""``--message-mb`` counts MiB, as ``hopdec sim``'s."""


def hosts_of(G: Any, machines: Optional[tuple] = None) -> dict:
    """node -> its host: the ``machine`` attribute, else the node itself; ``machines``: sizes of machines to
    place consecutive nodes on instead (:func:`hopdec.topology.generators.place_on_machines`), so that any
    graph can be put on the same machines."""
    if machines is not None:
        from hopdec.topology.generators import place_on_machines
        G = place_on_machines(G.copy(), machines)
    return {v: G.nodes[v].get("machine", v) for v in sorted(G.nodes)}


def _steps(G: Any) -> list:
    """The directed edges (self-loops left out) each iteration uses: one list on a static graph, one per
    step of a schedule (:mod:`hopdec.topology.schedule`)."""
    from hopdec.topology.schedule import schedule_of
    sched = schedule_of(G)
    if sched is None:
        return [[(u, v) for u, v in G.edges if u != v]]
    return [[(u, v) for u in G.nodes for v in sched.out_at(m, u) if v != u] for m in range(sched.period)]


def _bottleneck(edges: list, host: dict, nic: dict, link: Any) -> tuple[float, str, dict, dict]:
    """(seconds per byte of update, what needs them, sends per host, receives per host) for one step;
    ``nic``: host -> its NIC's bytes/s."""
    sends: dict = {}
    receives: dict = {}
    for u, v in edges:
        if host[u] != host[v]:
            sends[host[u]] = sends.get(host[u], 0) + 1
            receives[host[v]] = receives.get(host[v], 0) + 1
    worst, what = 0.0, "nothing crosses a NIC"
    for h in dict.fromkeys(host[v] for v in sorted(host)):      # in node order: the first of equals named
        out, into = sends.get(h, 0), receives.get(h, 0)
        loads = [(out + into, f"sending {_updates(out)} and receiving {_updates(into)}")] \
            if link.duplex == "half" else [(out, f"sending {_updates(out)}"), (into, f"receiving {_updates(into)}")]
        for count, doing in loads:
            if count and count / nic[h] > worst:
                worst, what = count / nic[h], f"{host_name(h)}'s NIC {doing} at {_gbps(nic[h])}"
    used = {(u, v) for u, v in edges if host[u] != host[v]}       # (inside a machine: shared memory)
    for (u, v), (bw, _lat) in link.links.items():
        if bw is not None and (u, v) in used and 1 / bw > worst:
            worst, what = 1 / bw, f"link {u}->{v} at {_gbps(bw)}"
    if not worst and sends:                 # (updates cross, at infinite bandwidth: --bandwidth inf)
        what = "every NIC and link the updates cross has infinite bandwidth"
    return worst, what, sends, receives


def traffic(G: Any, link: Any, message_mb: float = 1.0, machines: Optional[tuple] = None) -> dict:
    """The updates one iteration sends, in all and between hosts (``per_host``: host -> [sent, received], of
    the busiest step of a schedule), the busiest host, and the least transfer
    time per iteration for updates of ``message_mb`` MiB through ``link`` (a
    :class:`hopdec.sim.network.LinkModel`: the NICs' bandwidth in bytes/s, per node, per edge, duplex);
    ``machines``: place the workers on machines of these sizes (:func:`hosts_of`)."""
    host = hosts_of(G, machines)
    on: dict = {}                               # host -> its workers
    for v, h in host.items():
        on.setdefault(h, []).append(v)
    nic = {h: link.shared_nic(vs) for h, vs in on.items()}
    steps = _steps(G)
    per = [_bottleneck(edges, host, nic, link) for edges in steps]
    worst = max(range(len(per)), key=lambda k: per[k][0])
    spb = sum(p[0] for p in per) / len(per)             # a schedule runs its steps in turn
    sends, receives = per[worst][2], per[worst][3]
    busiest: Optional[dict] = None
    for h in dict.fromkeys(host[v] for v in sorted(G.nodes)):       # the first of the busiest, in node order
        load = max(sends.get(h, 0), receives.get(h, 0))
        if load and (busiest is None or load > max(busiest["sends"], busiest["receives"])):
            busiest = {"host": h, "sends": sends.get(h, 0), "receives": receives.get(h, 0)}
    lat = [link.links.get((u, v), (None, None))[1] for edges in steps for u, v in edges if host[u] != host[v]]
    seconds = spb * message_mb * MIB
    return {
        "hosts": len(set(host.values())),
        "hosts_are": "machines" if machines or any("machine" in G.nodes[v] for v in G.nodes) else "workers",
        "updates_per_iteration": _mean([len(e) for e in steps]),
        "updates_between_hosts": _mean([sum(p[2].values()) for p in per]),
        "busiest": busiest,
        "per_host": {h: [sends.get(h, 0), receives.get(h, 0)] for h in dict.fromkeys(host.values())},
        "message_mb": message_mb,
        "seconds_per_iteration": seconds,
        "max_iterations_per_s": None if seconds == 0 else 1 / seconds,
        "bottleneck": per[worst][1],
        "largest_latency_s": max((link.latency if x is None else x for x in lat), default=None),
    }


def _mean(xs: list) -> Any:
    m = sum(xs) / len(xs)
    return int(m) if m == int(m) else m


def _updates(k: int) -> str:
    return f"{k} update" + ("" if k == 1 else "s")


def host_name(h: Any) -> str:
    """How a report names host ``h``: ``machine m0``, or ``worker 3`` (a host of its own)."""
    return f"machine {h}" if isinstance(h, str) else f"worker {h}"


def _gbps(bytes_per_s: float) -> str:
    return "infinite bandwidth" if bytes_per_s == float("inf") else f"{bytes_per_s * 8 / 1e9:g} Gb/s"
