"""What a run computes, as its checkpoints record it: the settings a resumed run must share with the run
that wrote them (anything else -- ``--iterations``, ``--epochs``, output, ``--threads``, ``--peer-timeout``,
``--device``, emulated slowdowns -- may change). :mod:`hopdec.runtime.checkpoint` compares them."""

import hashlib
import json

SETTINGS = ("mode", "sync", "topology", "protocol", "max_ig", "compute_graph", "backup_workers",
            "staleness", "stale_reduce", "skip", "compress", "local_steps", "outer_optimizer", "outer_lr",
            "outer_momentum", "staleness_range", "lookahead", "esync_epsilon",
            "dataset", "partition", "model", "norm", "lr", "momentum", "weight_decay", "batch_size", "seed")
"""The options that decide what a run computes, as resolved from the options and the presets."""


def topology_fingerprint(graph):
    """The topology as it will be used (edges, mixing weights, per-node backup workers), hashed: two runs
    with the same fingerprint run the same graph whatever the files were called."""
    edges = sorted((int(u), int(v), round(float(d.get("weight", 1.0)), 12)) for u, v, d in graph.edges(data=True))
    nodes = sorted((int(n), d.get("backup_workers")) for n, d in graph.nodes(data=True))
    sched = graph.graph.get("schedule")             # a time-varying topology: every step counts
    h = hashlib.sha256(json.dumps([nodes, edges] + ([sched.fingerprint()] if sched else [])).encode()
                       ).hexdigest()[:16]
    source = graph.graph.get("source") or "topology"
    return {"sha256": h, "describe": f"{source} ({graph.number_of_nodes()} nodes, "
                                     f"{graph.number_of_edges()} edges, sha256 {h})"}


def samples_digest(ds, samples=512):
    """The dataset's contents hashed (16 hex digits): every label and up to ``samples`` evenly spaced inputs of
    each split. Ranks whose data factory or file gives the same sizes but other values (a seed that depends on
    the rank, a file that differs between hosts) trained on different data without a word; the size and
    shape in :func:`fingerprint` do not see them. Cheap at any size (at most 2 x ``samples`` inputs)."""
    import numpy as np
    h = hashlib.sha256()
    for x, y in ((ds.train_x, ds.train_y), (ds.test_x, ds.test_y)):
        for a in (x[::max(1, len(y) // samples)], y):
            a = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
            h.update(str((a.dtype, a.shape)).encode())
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def fingerprint(run):
    """What ``run`` (a :class:`~hopdec.modes.HopRun` or :class:`~hopdec.modes.PSRun` with its workload)
    computes (:data:`SETTINGS`); JSON-ready."""
    w, ds = run.work, run.work.dataset
    out = dict(mode=run.mode, dataset=f"{ds.name} ({len(ds.train_y)} training samples, input "
                                      f"{'x'.join(map(str, ds.input_shape))})",
               partition=w.settings.partition, model=w.model, norm=w.settings.norm, seed=w.settings.seed,
               **{k: w.hparams[k] for k in ("lr", "momentum", "weight_decay", "batch_size")})
    if run.mode == "decentralized":
        cfg = run.cfg
        out.update(topology=topology_fingerprint(run.graph)["sha256"], protocol=cfg.protocol,
                   compute_graph=cfg.compute_graph, max_ig=cfg.max_ig, backup_workers=cfg.backup_workers,
                   staleness=cfg.staleness, stale_reduce=cfg.stale_reduce,
                   skip=f"max-jump={cfg.skip_max_jump},trigger={cfg.skip_trigger}" if cfg.skip_max_jump else None,
                   compress=None if cfg.compress == "none" else cfg.compress)
        if cfg.rounds:                              # (absent without: older checkpoints still match)
            out.update(local_steps=cfg.local_steps, outer_optimizer=cfg.outer_optimizer, outer_lr=cfg.outer_lr,
                       outer_momentum=cfg.outer_momentum)
    elif run.mode == "ps":
        out.update(sync=run.sync, **{k: (list(v) if isinstance(v, tuple) else v)
                                     for k, v in run.policy.settings().items() if k in SETTINGS})
    return json.loads(json.dumps(out))
