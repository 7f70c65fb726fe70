"""What the launcher (``mpirun``, ``srun``, ...) told this process through its environment: whether one
started it, its rank, and its place among the ranks on its host. Read before MPI is initialised (a bad
command line is reported by rank 0 alone without it) and by what prints (a bar only without a launcher).
A network testbed (:mod:`hopdec.testbed`) also tells every rank the emulated network's conditions, for
its log header and summary.
"""

import json
import os

LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "SLURM_NTASKS", "MPI_LOCALNRANKS")
"""Variables one of the launchers hopdec knows sets in every process it starts (Open MPI, PMIx, MPICH/PMI,
Slurm, MPICH's Hydra)."""


def under_launcher():
    """True when an MPI launcher or batch system started this process."""
    return any(v in os.environ for v in LAUNCHER_VARS)


def launcher_rank():
    """This process's rank as the MPI launcher set it (Open MPI, MPICH/PMI, PMIx, Slurm), else 0."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def local_rank_and_size():
    """This rank's index and count on its host, from the launcher's environment (Open MPI, MPICH, Slurm)."""
    for r, s in (("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                 ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"), ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")):
        if r in os.environ:
            try:
                return int(os.environ[r]), int(os.environ.get(s, "1").split("(")[0])
            except ValueError:
                pass
    return 0, 1


# ---- the emulated network a run had (hopdec.testbed): pure, no kernel access ----
NETWORK_ENV = "HOPDEC_NETWORK"
"""JSON conditions a testbed passes to every rank (:meth:`hopdec.testbed.spec.Testbed.conditions`):
``hopdec train`` writes them into every log header (key ``network``) and names them on the summary's
``times:`` line, so a figure is never read without the links it was measured on."""
MAX_NETWORK_CHARS = 1 << 16


def network_conditions(environ=None):
    """The conditions in the environment: a dict, ``None`` when not set; a value that is not a JSON
    object (or is too long) is kept as ``{"unparsed": first 200 characters}`` -- a label, never code."""
    text = (os.environ if environ is None else environ).get(NETWORK_ENV)
    if not text:
        return None
    try:
        value = json.loads(text) if len(text) <= MAX_NETWORK_CHARS else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"unparsed": text[:200]}


MAX_LABEL_CHARS = 1200
"""The longest network label (a summary line; the header's ``hosts`` and ``links`` list everything)."""


def _hosts_text(names, idx):
    """Hosts ``idx`` (indices into ``names``, in host order) as short as they read: runs of names that count
    up (``r1``, ``r2``, ``r3``) as ``r1-r3``, the rest listed: ``r0, r4-r7``."""
    import re
    out, run = [], []

    def flush():
        if run:
            out.append(names[run[0]] if len(run) == 1 else f"{names[run[0]]}-{names[run[-1]]}")
    for i in idx:
        if run:
            a = re.fullmatch(r"(.*?)(\d+)", names[run[-1]])
            b = re.fullmatch(r"(.*?)(\d+)", names[i])
            if a and b and a.group(1) == b.group(1) and int(b.group(2)) == int(a.group(2)) + 1 and i == run[-1] + 1:
                run.append(i)
                continue
        flush()
        run = [i]
    flush()
    return ", ".join(out)


def _pairs_text(pairs, names):
    """A set of ordered host pairs ``(a, b)`` (indices) in a few words: ``between every two hosts``, ``between
    {r0-r3} and {r4-r7}`` (every pair across groups: links between machines), ``within {r0-r3}, {r4-r7}``
    (every pair inside each group), else the pairs by source, ``on r0->{r1, r2}, r3->r0`` (``<->`` where every
    pair goes both ways)."""
    n = len(names)
    if len(pairs) == n * (n - 1):
        return "between every two hosts"

    def groups(edges, nodes):                       # connected components, in host order
        parent = {v: v for v in nodes}

        def find(v):
            while parent[v] != v:
                parent[v] = parent[parent[v]]
                v = parent[v]
            return v
        for a, b in edges:
            parent[find(a)] = find(b)
        comps = {}
        for v in sorted(nodes):
            comps.setdefault(find(v), []).append(v)
        return sorted(comps.values())

    def cliques(edges, comps):                      # every ordered pair inside each component, nothing else
        return len(edges) == sum(len(c) * (len(c) - 1) for c in comps) and all(len(c) > 1 for c in comps)

    def braced(comps):
        return ", ".join("{" + _hosts_text(names, c) + "}" for c in comps)
    touched = {v for p in pairs for v in p}
    inside = groups(pairs, touched)
    if cliques(pairs, inside):
        if all(len(c) == 2 for c in inside):
            return "on " + ", ".join(f"{names[a]}<->{names[b]}" for a, b in inside)
        return "within " + braced(inside)
    rest = {(a, b) for a in range(n) for b in range(n) if a != b} - pairs
    parts = groups(rest, range(n))
    if len(parts) > 1 and len(rest) == sum(len(c) * (len(c) - 1) for c in parts):
        return ("between " + braced(parts[:-1]) + " and {" + _hosts_text(names, parts[-1]) + "}") \
            if len(parts) == 2 else "between " + braced(parts)
    both = all((b, a) in pairs for a, b in pairs)
    by_src = {}
    for a, b in sorted(pairs):
        if not both or a < b:
            by_src.setdefault(a, []).append(b)
    merged = {}                                     # sources with the same destinations share an entry
    for a, dsts in by_src.items():
        merged.setdefault(tuple(dsts), []).append(a)
    arrow = "<->" if both else "->"

    def one(idx):
        text = _hosts_text(names, idx)
        return "{" + text + "}" if "," in text else text
    return "on " + ", ".join(f"{one(srcs)}{arrow}{one(list(dsts))}"
                             for dsts, srcs in sorted(merged.items(), key=lambda kv: kv[1]))


def _mbit(x):
    return "unshaped" if x is None else f"{x:g} Mbit/s"


def network_parts(cond):
    """``(hosts, NICs, links)``: which host runs which ranks, and which host and which link has which
    bandwidth and delay, identical settings grouped -- ``m0 ranks 0-3, m1 ranks 4-5, m2 ranks 6-7``, ``50
    Mbit/s on m0, 100 Mbit/s on m1-m2``, ``20 Mbit/s +2 ms between every two hosts`` (links: None with one
    host). Raises (TypeError, ValueError, KeyError, AttributeError) on conditions of the wrong shape."""
    hosts = cond["hosts"]
    names = [str(h["name"]) for h in hosts]
    slots = [int(h.get("ranks", 1)) for h in hosts]
    for h in hosts:
        x = h.get("nic_mbit")
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
            raise TypeError(f"nic_mbit {x!r}")
    if all(k == 1 for k in slots) and names == [f"r{i}" for i in range(len(names))]:
        placed = f"{_hosts_text(names, range(len(names)))}" + (" (host rK runs rank K)" if len(names) > 1
                                                                else " (rank 0)")
    else:
        first, placed = 0, []
        for name, k in zip(names, slots):
            placed.append(f"{name} rank {first}" if k == 1 else f"{name} ranks {first}-{first + k - 1}")
            first += k
        placed = ", ".join(placed)
    nics = {}
    for i, h in enumerate(hosts):
        nics.setdefault(h.get("nic_mbit"), []).append(i)
    if len(nics) == 1:
        nic = f"{_mbit(next(iter(nics)))} on every host"
    else:
        nic = ", ".join(f"{_mbit(x)} on {_hosts_text(names, idx)}"
                        for x, idx in sorted(nics.items(), key=lambda kv: kv[1][0]))
    if len(names) < 2:
        return placed, nic, None
    index = {name: i for i, name in enumerate(names)}
    default = cond.get("default_link") or {}
    given = {(index[lk["src"]], index[lk["dst"]]): (lk.get("mbit"), float(lk.get("delay_ms") or 0.0))
             for lk in cond.get("links") or []}
    setting = {}                                    # (mbit, delay) -> the pairs that have it
    for a in range(len(names)):
        for b in range(len(names)):
            if a != b:
                key = given.get((a, b), (default.get("mbit"), float(default.get("delay_ms") or 0.0)))
                setting.setdefault(key, set()).add((a, b))
    for m, _ in setting:
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float))):
            raise TypeError(f"mbit {m!r}")
    usual = (default.get("mbit"), float(default.get("delay_ms") or 0.0))

    def where(key, pairs):
        text = _pairs_text(pairs, names)
        # the pairs no link was given for, when they form no group of their own: "every other host pair"
        # (a --link r1:r2=5/3 listed the other 11 pairs of 4 hosts one by one)
        return "on every other host pair" if key == usual and len(setting) > 1 and len(pairs) > 2 \
            and text.startswith("on ") else text
    links = "; ".join(_mbit(m) + (f" +{d:g} ms" if d else "") + " " + where((m, d), pairs)
                      for (m, d), pairs in sorted(setting.items(), key=lambda kv: (
                          kv[0] == usual and where(*kv).startswith("on every other"), min(kv[1]))))
    return placed, nic, links


def network_text(cond):
    """The conditions in one line (:func:`network_parts`): ``3 hosts in network namespaces (TB): m0 ranks
    0-3, ...; NIC per direction: 50 Mbit/s on m0, ...; links (bandwidth, one-way delay): ...``, at most
    :data:`MAX_LABEL_CHARS` (the log header's ``hosts`` and ``links`` list every one)."""
    placed, nic, links = network_parts(cond)
    where = f" ({cond['testbed']})" if cond.get("testbed") else ""
    n = len(cond["hosts"])
    text = (f"{n} host{'s' if n != 1 else ''} in network namespaces{where}: {placed}; NIC per direction: {nic}"
            + (f"; links (bandwidth, one-way delay): {links}" if links else ""))
    if len(text) > MAX_LABEL_CHARS:
        text = text[:MAX_LABEL_CHARS - 60].rsplit(" ", 1)[0] + " ... (every host and link: the log header's network)"
    return text


def network_label(cond):
    """One line for the summary and the report: ``network EMULATED: ...`` saying which host and which link
    has which bandwidth and delay, identical settings grouped (:func:`network_text`)."""
    if not cond:
        return ""
    if "hosts" not in cond:
        return "network EMULATED (conditions not readable)"
    try:
        return "network EMULATED: " + network_text(cond)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError):
        return "network EMULATED (conditions not readable)"
