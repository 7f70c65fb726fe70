"""How one rank of :class:`hopdec.optim.HopOptimizer` is put together: the topology, the protocol settings,
the core, the transport, the log header, the observers, the healer.

The topology is resolved as ``hopdec train`` resolves it (:mod:`hopdec.modes.decentralized`), the
protocol settings are checked by the same settings group (:class:`hopdec.settings.Protocol`), with the
optimizer's keyword names in the errors; the transport and header are those of
:class:`hopdec.modes.decentralized.HopRun` for a run whose workload is the user's.
"""

import os

from hopdec.errors import ConfigError

OPTION_NAMES = {"--max-ig": "max_ig", "--protocol": "protocol", "--compute-graph": "compute_graph",
                "--backup-workers": "backup_workers", "--staleness": "staleness", "--skip": "skip",
                "--stale-reduce": "stale_reduce", "--iterations": "steps", "--topology": "topology",
                "--fault-tolerance": "fault_tolerance", "--peer-timeout": "peer_timeout",
                "--progress-interval": "progress_interval", "--log-dir": "log_dir"}
"""``hopdec train``'s option names in the shared checks' messages -> the optimizer's keyword names."""


def as_keywords(err):
    """A ConfigError from the shared checks, reworded with the optimizer's keyword names."""
    text = str(err)
    for option, keyword in OPTION_NAMES.items():
        text = text.replace(option, keyword)
    return ConfigError(f"HopOptimizer: {text}")


def resolve_topology(spec, size):
    """A topology file, a generator kind of ``hopdec topo generate`` built over all ranks (``"ring"``), an
    ``nx.DiGraph``, or None for the default: what ``hopdec train --topology`` takes
    (:func:`hopdec.modes.decentralized.resolve_topology`), plus a graph object."""
    from hopdec import topology as T
    from hopdec.modes.decentralized import is_generator
    from hopdec.modes.decentralized import resolve_topology as resolve
    if spec is not None and not isinstance(spec, (str, os.PathLike)):
        return T.effective_graph(spec, spec.graph.get("source", "topology"))
    spec = None if spec is None else os.fspath(spec)
    if spec is not None and not os.path.exists(spec) and not is_generator(spec):
        raise ConfigError(f"topology {spec!r}: no such file, and not a generator kind (one of "
                          f"{', '.join(sorted(T.GENERATORS))})")
    try:
        return resolve(spec, size)
    except ConfigError as err:
        raise ConfigError(str(err).replace("--topology", "topology")) from None


def protocol_config(protocol, max_ig, compute_graph, backup_workers, staleness, stale_reduce, skip, graph,
                    fault_tolerant=False):
    """(ProtocolConfig, node views), checked (ConfigError with the optimizer's keyword names) by the same
    rules as ``hopdec train``'s options: the values by :class:`hopdec.settings.Protocol` (ranges, the skip
    syntax), the protocol's constraints by :func:`hopdec.hop.config.check_config`. The run has no iteration
    budget: it ends when every rank has called ``finish()``."""
    from hopdec.hop.config import check_config
    from hopdec.hop.worker import node_views
    from hopdec.settings.protocol import Protocol
    try:
        if isinstance(skip, dict):
            unknown = set(skip) - {"max_jump", "trigger"}
            if unknown or "max_jump" not in skip:
                raise ConfigError(f"--skip {skip!r}: expected {{'max_jump': J, 'trigger': G}}")
            skip = f"max-jump={int(skip['max_jump'])},trigger={int(skip.get('trigger', 2))}"
        settings = Protocol(protocol=protocol, max_ig=max_ig, compute_graph=compute_graph,
                            backup_workers=backup_workers, staleness=staleness, stale_reduce=stale_reduce,
                            skip=skip)
        cfg = settings.config(2 ** 62, fault_tolerant=bool(fault_tolerant))
        views = node_views(graph)
        check_config(cfg, views)
    except ConfigError as err:
        raise as_keywords(err) from None
    return cfg, views


def make_transport(comm, view, numel, slots, peer_timeout, device, fault_tolerant):
    """The Hop messages of this rank (host buffers; pinned when the model is on a GPU)."""
    from hopdec.transport.mpi import MPITransport
    return MPITransport(comm, view, numel, slots, peer_timeout=peer_timeout,
                        host_pinned=device.type == "cuda", fault_tolerant=fault_tolerant)


def header(graph, cfg, skip, numel, device, message_floats, bound, ft, extra):
    """The first line of ``rank{r}.jsonl``: what ``hopdec report/plot/trace`` read about the run."""
    from hopdec.hop.config import setting_name
    return dict(mode="decentralized", topology=graph.graph.get("source"), protocol=cfg.protocol,
                setting=setting_name(cfg, graph), max_ig=cfg.max_ig, staleness=cfg.staleness,
                backup_workers=cfg.backup_workers,
                skip=(f"max-jump={cfg.skip_max_jump},trigger={cfg.skip_trigger}" if cfg.skip_max_jump else None),
                compute_graph=cfg.compute_graph, params=numel, device=str(device), mpi_buffers="host",
                gap_bound=bound, message_bytes=4 * message_floats, fault_tolerance=ft,
                emulation="no emulation (the user's own loop: compute_s is the time between steps)", **extra)


def observe_settings(log_dir, progress, interval, trace):
    """What :class:`hopdec.observe.RunObserver` watches in a user's loop (``hopdec train`` builds the same
    :class:`hopdec.settings.Observe` from its options): logs, live progress, a trace."""
    from hopdec.settings.observe import Observe
    try:
        return Observe(log_dir=log_dir, progress=bool(progress), progress_interval=interval, trace=trace)
    except ConfigError as err:
        raise as_keywords(err) from None
