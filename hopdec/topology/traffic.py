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

import numpy as np

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
    """The directed edges (self-loops left out) each iteration uses, as two arrays ``(senders, receivers)``:
    one pair on a static graph, one per step of a schedule (:mod:`hopdec.topology.schedule`)."""
    from hopdec.topology.schedule import schedule_of
    sched = schedule_of(G)
    if sched is None:
        pairs = [(u, v) for u, v in G.edges if u != v]
        return [tuple(np.array([p[i] for p in pairs], dtype=np.int64) for i in (0, 1))]
    return [sched.arcs(m) for m in range(sched.period)]


def _bottleneck(u: Any, v: Any, hosts: list, nic: dict, link: Any) -> tuple[float, str, Any, Any]:
    """(seconds per byte of update, what needs them, sends per host, receives per host) for one step whose
    edges join hosts ``u[k] -> v[k]`` (indices into ``hosts``, in node order); ``nic``: host -> its NIC's
    bytes/s. Counted on arrays; the first of equals (in node order, sending before receiving) is named."""
    cross = u != v
    sends = np.bincount(u[cross], minlength=len(hosts))
    receives = np.bincount(v[cross], minlength=len(hosts))
    bw = np.array([nic[h] for h in hosts], dtype=float)
    worst, what = 0.0, "nothing crosses a NIC"
    if link.duplex == "half":
        loads = (sends + receives)[:, None]
    else:
        loads = np.stack([sends, receives], axis=1)             # per host: sending, then receiving
    ratio = (loads / bw[:, None]).ravel()
    k = int(np.argmax(ratio)) if len(ratio) else 0
    if len(ratio) and ratio[k] > 0:
        h, side = divmod(k, loads.shape[1])
        out, into = int(sends[h]), int(receives[h])
        doing = (f"sending {_updates(out)} and receiving {_updates(into)}" if link.duplex == "half" else
                 f"sending {_updates(out)}" if side == 0 else f"receiving {_updates(into)}")
        worst, what = float(ratio[k]), f"{host_name(hosts[h])}'s NIC {doing} at {_gbps(nic[hosts[h]])}"
    return worst, what, sends, receives


def _links(worst: float, what: str, edges: Any, cross: Any, link: Any) -> tuple[float, str]:
    """A link's own bandwidth, where it is slower than the NICs (``link.links``: the file's edge attributes;
    inside a machine updates go through shared memory)."""
    if not link.links:
        return worst, what
    u, v = edges
    used = set(zip(u[cross].tolist(), v[cross].tolist()))
    for (a, b), (bw, _lat) in link.links.items():
        if bw is not None and (a, b) in used and 1 / bw > worst:
            worst, what = 1 / bw, f"link {a}->{b} at {_gbps(bw)}"
    return worst, what


def traffic(G: Any, link: Any, message_mb: float = 1.0, machines: Optional[tuple] = None) -> dict:
    """The updates one iteration sends, in all and between hosts (``per_host``: host -> [sent, received], of
    the busiest step of a schedule), the busiest host, and the least transfer
    time per iteration for updates of ``message_mb`` MiB through ``link`` (a
    :class:`hopdec.sim.network.LinkModel`: the NICs' bandwidth in bytes/s, per node, per edge, duplex);
    ``machines``: place the workers on machines of these sizes (:func:`hosts_of`)."""
    host = hosts_of(G, machines)
    on: dict = {}                               # host -> its workers, hosts in node order
    for v, h in host.items():
        on.setdefault(h, []).append(v)
    nic = {h: link.shared_nic(vs) for h, vs in on.items()}
    hosts = list(on)
    index = {h: k for k, h in enumerate(hosts)}
    nodes = list(host)
    of_node = np.array([index[host[v]] for v in nodes], dtype=np.int64)
    if nodes != list(range(len(nodes))):        # (a run's ranks are 0..n-1; a library graph's other ids: a lookup)
        at = {v: k for k, v in enumerate(nodes)}
        position = np.vectorize(at.__getitem__, otypes=[np.int64])
    else:
        position = None
    steps = _steps(G)
    per, crosses = [], []
    for u, v in steps:
        hu, hv = (of_node[position(x)] if position and len(x) else of_node[x] for x in (u, v))
        worst, what, sends, receives = _bottleneck(hu, hv, hosts, nic, link)
        cross = hu != hv
        worst, what = _links(worst, what, (u, v), cross, link)
        if not worst and sends.any():           # (updates cross, at infinite bandwidth: --bandwidth inf)
            what = "every NIC and link the updates cross has infinite bandwidth"
        per.append((worst, what, sends, receives))
        crosses.append(cross)
    worst = max(range(len(per)), key=lambda k: per[k][0])
    spb = sum(p[0] for p in per) / len(per)             # a schedule runs its steps in turn
    sends, receives = per[worst][2], per[worst][3]
    busiest: Optional[dict] = None
    load = np.maximum(sends, receives)                  # the first of the busiest, in node order
    if len(load) and load.max() > 0:
        h = int(np.argmax(load))
        busiest = {"host": hosts[h], "sends": int(sends[h]), "receives": int(receives[h])}
    if link.links:
        lat = [link.links.get((a, b), (None, None))[1] for (u, v), cross in zip(steps, crosses)
               for a, b in zip(u[cross].tolist(), v[cross].tolist())]
    else:
        lat = [None] if any(c.any() for c in crosses) else []
    seconds = spb * message_mb * MIB
    return {
        "hosts": len(set(host.values())),
        "hosts_are": "machines" if machines or any("machine" in G.nodes[v] for v in G.nodes) else "workers",
        "updates_per_iteration": _mean([len(u) for u, _ in steps]),
        "updates_between_hosts": _mean([int(p[2].sum()) for p in per]),
        "busiest": busiest,
        "per_host": dict(zip(hosts, ([a, b] for a, b in zip(sends.tolist(), receives.tolist())))),
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
