"""How one rank of :class:`hopdec.optim.HopOptimizer` is put together: the topology, the protocol settings,
the core, the transport, the log header, the observers, the healer.

The topology is resolved as ``hopdec train`` resolves it (:mod:`hopdec.modes.decentralized`) and the
protocol settings are its :class:`hopdec.settings.Protocol` (the same ranges and rules, errors reworded
with the optimizer's keyword names); the transport and header follow what
:class:`hopdec.modes.decentralized.HopRun` does for a run whose workload hopdec owns.
"""

import os

from hopdec.errors import ConfigError

OPTION_NAMES = {"--max-ig": "max_ig", "--protocol": "protocol", "--compute-graph": "compute_graph",
                "--backup-workers": "backup_workers", "--staleness": "staleness", "--skip": "skip",
                "--stale-reduce": "stale_reduce", "--iterations": "steps", "--topology": "topology",
                "--fault-tolerance": "fault_tolerance", "--peer-timeout": "peer_timeout",
                "--progress-interval": "progress_interval", "--log-dir": "log_dir", "--compress": "compress",
                "--local-steps": "local_steps", "--outer-optimizer": "outer_optimizer", "--outer-lr": "outer_lr",
                "--outer-momentum": "outer_momentum", "--consensus-every": "consensus_every", "--trace": "trace",
                "--tensorboard": "tensorboard", "--overwrite": "overwrite=True",
                "--checkpoint-every": "checkpoint_every"}
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
    from hopdec.modes.decentralized import resolve_topology as resolve
    if spec is not None and not isinstance(spec, (str, os.PathLike)):
        return T.from_graph(spec, spec.graph.get("source", "topology"))
    spec = None if spec is None else os.fspath(spec)
    try:
        return resolve(spec, size)
    except ConfigError as err:
        raise as_keywords(err) from None


def protocol_config(protocol, max_ig, compute_graph, backup_workers, staleness, stale_reduce, skip, graph,
                    fault_tolerant=False, compress="none", local=(1, None, None, None), checkpoint_every=None):
    """(ProtocolConfig, node views, notes), checked (ConfigError with the optimizer's keyword names; the notes
    are the lines ``hopdec train`` prints as ``note:`` about settings that work but not as one may expect, with
    the same names). The same
    :class:`hopdec.settings.Protocol` as ``hopdec train`` builds, so every range and rule is the CLI's. The
    run has no iteration budget: it ends when every rank has called ``finish()``. ``skip``: None,
    ``"max-jump=J,trigger=G"`` or ``{"max_jump": J, "trigger": G}``; ``local``: (local_steps,
    outer_optimizer, outer_lr, outer_momentum) as given (None: the defaults); ``checkpoint_every``: None or
    K >= 1, the iterations every worker enters (a jump never passes one)."""
    from hopdec.hop.config import check_config
    from hopdec.hop.protocols import PROTOCOLS
    from hopdec.hop.worker import node_views
    from hopdec.settings.protocol import Protocol
    try:
        steps = local[0]
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise ConfigError(f"--local-steps {steps!r}: must be an integer >= 1")
        every = checkpoint_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ConfigError(f"--checkpoint-every {every!r}: must be an integer >= 1 (iterations), or None")
        if isinstance(skip, dict):
            unknown = set(skip) - {"max_jump", "trigger"}
            if unknown or "max_jump" not in skip:
                raise ConfigError(f"--skip {skip!r}: expected {{'max_jump': J, 'trigger': G}}")
            skip = f"max-jump={int(skip['max_jump'])},trigger={int(skip.get('trigger', 2))}"
        settings = Protocol(protocol=protocol, max_ig=max_ig, compute_graph=compute_graph,
                            backup_workers=backup_workers, staleness=staleness, stale_reduce=stale_reduce,
                            skip=skip, compress=compress, local_steps=steps, outer_optimizer=local[1],
                            outer_lr=local[2], outer_momentum=local[3])
        cfg = settings.config(2 ** 62, checkpoint_every=every, fault_tolerant=bool(fault_tolerant))
        views = node_views(graph, ahead=PROTOCOLS[cfg.protocol].path_bounded)
        notes = [str(as_keywords(ConfigError(note))) for note in check_config(cfg, views)]
    except ConfigError as err:
        raise as_keywords(err) from None
    return cfg, views, notes


ARRIVAL_S = 600.0
"""How long, by default, the ranks wait for each other to reach the constructor: they come from the user's
own start-up (a download or a dataset read on one rank may take minutes), so longer than a peer timeout."""


def arrived(comm, peer_timeout, fault_tolerant=False):
    """Every rank reached its constructor within ``HOPDEC_STARTUP_TIMEOUT`` seconds if set, else
    max(:data:`ARRIVAL_S`, ``peer_timeout``) (a bounded barrier: PeerTimeout with one line, not a job
    that waits for ever for a rank that hung or stopped before building its optimizer). Fault tolerant, a
    roll call of point-to-point messages instead (as ``hopdec train``'s start-up): a rank that died before
    its constructor is named as dead -- under ULFM a nonblocking barrier that met a death left its own
    sends behind, and their failure aborted the job from inside Open MPI ("Send error after request
    freed"); found by the failure campaign."""
    import os

    from hopdec.runtime.startup import ENV_TIMEOUT, timeout
    from hopdec.transport.collectives import barrier
    if comm.Get_size() == 1:
        return
    bound = timeout(peer_timeout) if os.environ.get(ENV_TIMEOUT, "").strip() else max(ARRIVAL_S, peer_timeout)
    if fault_tolerant:
        from hopdec.runtime.startup import roll_call
        roll_call(comm, bound, "HopOptimizer()", "did not build its optimizer",
                  f"{ENV_TIMEOUT}=seconds allows longer")
        return
    barrier(comm, bound, f"HopOptimizer(), built by every rank (a collective; {ENV_TIMEOUT}=seconds allows "
                         f"longer)")


def make_transport(comm, view, numel, slots, peer_timeout, device, fault_tolerant, compress="none"):
    """The Hop messages of this rank (host buffers; pinned when the model is on a GPU); coded per-edge
    streams with ``compress`` (as ``hopdec train --compress``)."""
    if compress != "none":
        from hopdec.transport.coded_mpi import CodedMPITransport
        io = CodedMPITransport(comm, view, numel, slots, compress, peer_timeout=peer_timeout,
                               host_pinned=device.type == "cuda")
    else:
        from hopdec.transport.mpi import MPITransport
        io = MPITransport(comm, view, numel, slots, peer_timeout=peer_timeout,
                          host_pinned=device.type == "cuda", fault_tolerant=fault_tolerant)
    # in a user's loop the likeliest silent peer is one busy between its steps (an evaluation, a save)
    io.silence = ("a peer may have died or hung, or spent longer than that between two steps (evaluating "
                  "or saving on one rank?): HopOptimizer(peer_timeout=...) allows more")
    return io


def header(graph, cfg, skip, numel, device, message_floats, bound, ft, extra):
    """The first line of ``rank{r}.jsonl``: what ``hopdec report/plot/trace`` read about the run."""
    from hopdec.hop.config import setting_name
    from hopdec.transport.codec import message_bytes as coded_bytes
    return dict(mode="decentralized", workers=graph.number_of_nodes(), topology=graph.graph.get("source"),
                protocol=cfg.protocol, setting=setting_name(cfg, graph), max_ig=cfg.max_ig, staleness=cfg.staleness,
                backup_workers=cfg.backup_workers,
                skip=(f"max-jump={cfg.skip_max_jump},trigger={cfg.skip_trigger}" if cfg.skip_max_jump else None),
                compute_graph=cfg.compute_graph, params=numel, device=str(device), mpi_buffers="host",
                gap_bound=bound, message_bytes=coded_bytes(cfg.compress, numel) if cfg.compress != "none" else
                4 * message_floats, fault_tolerance=ft, compress=cfg.compress,
                **({"local_steps": cfg.local_steps, "outer": dict(optimizer=cfg.outer_optimizer, lr=cfg.outer_lr,
                                                                   momentum=cfg.outer_momentum)} if cfg.rounds else {}),
                emulation="no emulation (the user's own loop: compute_s is the time between steps)", **extra)


def observe_settings(log_dir, progress, interval, trace, consensus_every=None, tensorboard=None, rank=0):
    """What :class:`hopdec.observe.RunObserver` watches in a user's loop (``hopdec train`` builds the same
    :class:`hopdec.settings.Observe` from its options): logs, live progress, a trace, consensus distance,
    TensorBoard; checked as ``hopdec train`` checks them (a trace file rank 0 cannot write was found only
    when the run ended, after the training, with a traceback)."""
    from hopdec.observe.options import check_observe_options
    from hopdec.settings.observe import Observe
    try:
        watch = Observe(log_dir=log_dir, progress=bool(progress), progress_interval=interval, trace=trace,
                        consensus_every=consensus_every, tensorboard=tensorboard)
        check_observe_options(watch, rank)
        return watch
    except ConfigError as err:
        raise as_keywords(err) from None
