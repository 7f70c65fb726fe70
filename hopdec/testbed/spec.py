"""What an emulated network is: hosts (with a NIC each) and the links between them, as plain data.

A :class:`Testbed` says how many MPI ranks each host runs, each host's NIC capacity (per direction)
and, for any ordered pair of hosts, the link's own capacity and one-way delay. Nothing here touches the
kernel: :mod:`hopdec.testbed.netns` builds it, :func:`sim_topology` turns it into the simulator's edge
and node attributes, :meth:`Testbed.conditions` is what every run's log header records.

Ranks are placed on hosts in order (as ``launch/hostfile.sh -m slot`` does): host 0 runs ranks
``0..slots0-1``, host 1 the next ``slots1``, and so on. Ranks of one host talk over shared memory (one
machine); ranks of two hosts over TCP through the emulated network.
"""

import json
import math
import re
from dataclasses import dataclass, field
from typing import Optional

from hopdec.errors import ConfigError

NAME = re.compile(r"^[a-z][a-z0-9]{0,5}$")
"""A host name: short (it becomes part of interface-free namespace and host names), lowercase."""
MAX_HOSTS = 200
"""Hosts get the subnets 10.213.0.0/24 .. 10.213.199.0/24 inside their namespaces."""


MIN_MBIT, MAX_MBIT = 0.01, 1e6
"""The bandwidths ``tc`` shapes (10 kbit/s .. 1 Tbit/s): 1e12 Mbit/s overflowed its burst ("Illegal
burst", after the namespaces were built) and 1e-9 rounded to "rate 0bit"."""


def check_mbit(mbit, what):
    """ConfigError unless ``mbit`` is None (unshaped) or a bandwidth ``tc`` shapes."""
    if mbit is not None and not (isinstance(mbit, (int, float)) and not isinstance(mbit, bool)
                                 and MIN_MBIT <= mbit <= MAX_MBIT):
        raise ConfigError(f"{what} must be {MIN_MBIT:g}..{MAX_MBIT:g} Mbit/s (inf: unshaped), got {mbit!r}")


@dataclass(frozen=True)
class Link:
    """One direction between two hosts: capacity in Mbit/s (``None``: only the NICs limit it) and one-way
    delay in milliseconds."""

    mbit: Optional[float] = None
    delay_ms: float = 0.0

    def __post_init__(self):
        check_mbit(self.mbit, "link bandwidth")
        if not (isinstance(self.delay_ms, (int, float)) and math.isfinite(self.delay_ms)
                and 0 <= self.delay_ms <= 10_000):
            raise ConfigError(f"link delay must be 0..10000 ms, got {self.delay_ms!r}")

    def describe(self):
        bw = "unshaped" if self.mbit is None else f"{self.mbit:g} Mbit/s"
        return bw + (f", +{self.delay_ms:g} ms" if self.delay_ms else "")

    def as_dict(self):
        return {"mbit": self.mbit, "delay_ms": self.delay_ms}


@dataclass(frozen=True)
class Host:
    """A machine: ``slots`` MPI ranks and a NIC of ``nic_mbit`` per direction (``None``: unshaped)."""

    name: str
    slots: int = 1
    nic_mbit: Optional[float] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise ConfigError(f"host name {self.name!r}: use 1-6 lowercase letters and digits, a letter first")
        if not (isinstance(self.slots, int) and not isinstance(self.slots, bool) and 1 <= self.slots <= 256):
            raise ConfigError(f"host {self.name}: slots must be 1..256, got {self.slots!r}")
        check_mbit(self.nic_mbit, f"host {self.name}: NIC bandwidth")


@dataclass(frozen=True)
class Testbed:
    """Hosts and links. ``links[(a, b)]``: the link from host ``a`` to host ``b`` (names); a pair not
    listed gets ``default``. ``mtu``: every emulated interface's MTU (9000: jumbo frames, as in a data
    centre; fewer packets for the delay forwarder to carry)."""

    hosts: tuple
    links: dict = field(default_factory=dict)
    default: Link = Link()
    mtu: int = 9000

    def __post_init__(self):
        names = [h.name for h in self.hosts]
        if not names:
            raise ConfigError("a testbed needs at least one host")
        if len(names) > MAX_HOSTS:
            raise ConfigError(f"a testbed has at most {MAX_HOSTS} hosts, got {len(names)}")
        if len(set(names)) != len(names):
            raise ConfigError(f"host names must be distinct: {names}")
        for (a, b) in self.links:
            if a not in names or b not in names or a == b:
                raise ConfigError(f"link {a}->{b}: both ends must be hosts of the testbed, and different")
        if not (isinstance(self.mtu, int) and 1280 <= self.mtu <= 65000):
            raise ConfigError(f"mtu must be 1280..65000, got {self.mtu!r}")

    # ---- what runs where ----
    @property
    def ranks(self):
        """Total MPI ranks (the sum of the slots)."""
        return sum(h.slots for h in self.hosts)

    def host_of(self):
        """Host index of every rank, in rank order (ranks fill each host before the next)."""
        return [i for i, h in enumerate(self.hosts) for _ in range(h.slots)]

    def index(self, name):
        return [h.name for h in self.hosts].index(name)

    def link(self, a, b):
        """The :class:`Link` from host ``a`` to host ``b`` (indices or names)."""
        a = self.hosts[a].name if isinstance(a, int) else a
        b = self.hosts[b].name if isinstance(b, int) else b
        return self.links.get((a, b), self.default)

    def delays(self):
        """``[(i, j, seconds)]`` of the host pairs with a delay (indices)."""
        n = len(self.hosts)
        return [(i, j, self.link(i, j).delay_ms / 1e3) for i in range(n) for j in range(n)
                if i != j and self.link(i, j).delay_ms > 0]

    # ---- the record ----
    def conditions(self):
        """The emulated network as JSON-able data: what every run's log header records; ``described``:
        which host and link has which bandwidth and delay in one line (:func:`hopdec.launcher.network_text`)."""
        from hopdec.launcher import network_text
        n = len(self.hosts)
        c = {
            "emulated": "network namespaces on one machine: a host per namespace, veth links to a router "
                        "namespace; bandwidth by htb (a NIC shared fairly between destinations, packets of "
                        "one MTU), delay by a userspace TUN forwarder; all hosts share this machine's CPUs",
            "hosts": [{"name": h.name, "ranks": h.slots, "nic_mbit": h.nic_mbit} for h in self.hosts],
            "links": [{"src": self.hosts[i].name, "dst": self.hosts[j].name, **self.link(i, j).as_dict()}
                      for i in range(n) for j in range(n) if i != j and (self.hosts[i].name, self.hosts[j].name)
                      in self.links],
            "default_link": self.default.as_dict(),
            "mtu": self.mtu,
        }
        c["described"] = network_text(c)
        return c

    def describe(self):
        """A few lines for a human: which host runs which ranks, and which host and link has which bandwidth
        and delay, identical settings grouped (:func:`hopdec.launcher.network_parts`)."""
        from hopdec.launcher import network_parts
        placed, nic, links = network_parts(self.conditions())
        lines = ["EMULATED network (namespaces on one machine; hosts share its CPUs):",
                 f"  hosts: {placed}", f"  NIC per direction: {nic}"]
        if links:
            lines.append(f"  links (bandwidth, one-way delay): {links}")
        lines.append(f"  MTU {self.mtu}")
        return "\n".join(lines)

    def to_json(self):
        return json.dumps({"hosts": [{"name": h.name, "slots": h.slots, "nic_mbit": h.nic_mbit} for h in self.hosts],
                           "links": [{"src": a, "dst": b, **lk.as_dict()} for (a, b), lk in sorted(self.links.items())],
                           "default": self.default.as_dict(), "mtu": self.mtu}, indent=1)


def from_json(text, source="testbed"):
    """A :class:`Testbed` from :meth:`Testbed.to_json`'s format; a ConfigError names what is wrong."""
    try:
        d = json.loads(text)
        hosts = tuple(Host(str(h["name"]), int(h.get("slots", 1)), h.get("nic_mbit")) for h in d["hosts"])
        links = {(str(x["src"]), str(x["dst"])): Link(x.get("mbit"), x.get("delay_ms", 0.0))
                 for x in d.get("links", [])}
        default = Link(**d["default"]) if "default" in d else Link()
        return Testbed(hosts, links, default, int(d.get("mtu", 9000)))
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"{source}: not a testbed description ({type(err).__name__}: {err})") from None


# ---- testbeds for a topology --------------------------------------------------------------------------
def machines_of(G):
    """Machine name of every rank of topology ``G`` (its nodes' ``machine`` attribute; ``None`` if absent)."""
    return [G.nodes[r].get("machine") for r in range(G.number_of_nodes())]


def by_machine(G, nic_mbit=None, cross=Link(), names=None):
    """One host per machine of ``G`` (node attribute ``machine``), its ranks over shared memory, every
    pair of machines joined by ``cross``. The ranks of a machine must be consecutive (they are placed in
    order). ``names``: host names (default ``m0, m1, ...`` in order of the machines' first rank)."""
    owners = machines_of(G)
    if any(m is None for m in owners):
        raise ConfigError("placement by machine needs a `machine` attribute on every node of the topology")
    order, sizes = [], []
    for m in owners:
        if order and order[-1] == m:
            sizes[-1] += 1
        elif m in order:
            raise ConfigError(f"machine {m!r}: its ranks are not consecutive (ranks fill hosts in order)")
        else:
            order.append(m)
            sizes.append(1)
    names = list(names or [f"m{i}" for i in range(len(order))])
    hosts = tuple(Host(names[i], sizes[i], nic_mbit) for i in range(len(order)))
    links = {(a.name, b.name): cross for a in hosts for b in hosts if a is not b}
    return Testbed(hosts, links)


def by_rank(G, nic_mbit=None, cross=Link(), local=Link(), server_mbit=None):
    """One host per rank (every rank has a NIC of its own, as the simulator's model does); a link
    between ranks on different machines of ``G`` is ``cross``, on the same machine ``local`` (a rank
    without a ``machine`` attribute is a machine of its own). ``server_mbit``: rank 0's NIC (a parameter server's)."""
    owners = [m if m is not None else ("rank", r) for r, m in enumerate(machines_of(G))]
    n = len(owners)
    hosts = tuple(Host(f"r{r}", 1, server_mbit if (r == 0 and server_mbit is not None) else nic_mbit)
                  for r in range(n))
    links = {}
    for a in range(n):
        for b in range(n):
            if a != b:
                lk = cross if owners[a] != owners[b] else local
                if lk != Link():
                    links[(f"r{a}", f"r{b}")] = lk
    return Testbed(hosts, links)


def sim_topology(G, testbed, base_latency_s=0.0):
    """A copy of topology ``G`` with the simulator's network attributes for ``testbed``: node
    ``bandwidth`` (Gb/s) = the host's NIC, node ``machine`` = the host where it has several ranks (they
    share its NIC and exchange through shared memory, as in the simulator's
    :class:`~hopdec.sim.network.LinkModel`), edge ``latency`` = ``base_latency_s`` + the link's one-way
    delay and edge ``bandwidth`` = the link's capacity.

    Exact for one rank per host (:func:`by_rank`), and for several wherever links have no capacity of their
    own (NICs only, as ``--cross inf/MS``). A link with a capacity between hosts of several ranks is shared
    by every edge between them, which the simulator has no resource for: each gets the static share
    ``capacity / edges from host a to host b`` (exact when those transfers all run at once)."""
    H = G.copy()
    where = testbed.host_of()
    if len(where) != G.number_of_nodes():
        raise ConfigError(f"the testbed runs {len(where)} ranks, the topology has {G.number_of_nodes()} workers")
    hosts = testbed.hosts
    between = {}                                    # (host a, host b) -> edges from a to b
    for u, v in G.edges():
        if u != v and where[u] != where[v]:
            between[(where[u], where[v])] = between.get((where[u], where[v]), 0) + 1
    for r in range(G.number_of_nodes()):
        H.nodes[r].pop("bandwidth", None)
        H.nodes[r].pop("machine", None)             # the testbed's hosts, not the file's machines
        host = hosts[where[r]]
        if host.slots > 1:
            H.nodes[r]["machine"] = host.name
        if host.nic_mbit is not None:
            H.nodes[r]["bandwidth"] = host.nic_mbit / 1e3
    for u, v, d in H.edges(data=True):
        d.pop("bandwidth", None)
        d.pop("latency", None)
        a, b = where[u], where[v]
        if u == v or a == b:
            continue                                # self-loops carry nothing; shared memory inside a host
        lk = testbed.link(a, b)
        d["latency"] = base_latency_s + lk.delay_ms / 1e3
        if lk.mbit is not None:
            d["bandwidth"] = lk.mbit / between[(a, b)] / 1e3
    return H
