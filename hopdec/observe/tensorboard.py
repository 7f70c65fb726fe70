"""``--tensorboard DIR``: TensorBoard scalars, one run per rank (``DIR/rank{r}``), so TensorBoard overlays
the workers. Written with ``torch.utils.tensorboard`` (the ``tensorboard`` package, an optional extra);
the step is the iteration and the wall time the record's, so TensorBoard's "relative" axis is the run's
time. The JSONL logs stay the source of truth; these are a view of them.

Per worker: ``loss``, ``time/compute_s``, ``time/wait_s`` and its parts (``time/wait_updates_s``, ...),
``time/reduce_s``, ``time/send_s``, ``queue/tokens``, ``queue/held``, ``updates/used``, ``updates/dropped``,
``jumps``; PS workers also ``ps/staleness``, ``ps/push_interval_s``. Rank 0: ``consensus/mean``,
``consensus/max`` (decentralized), ``server/version``, ``server/staleness``, ``server/dropped``,
``server/test_acc`` (PS).
"""

import os

from hopdec.errors import ConfigError

RECORD_SCALARS = (("loss", "loss"), ("compute_s", "time/compute_s"), ("wait_s", "time/wait_s"),
                  ("wait_updates_s", "time/wait_updates_s"), ("wait_tokens_s", "time/wait_tokens_s"),
                  ("wait_acks_s", "time/wait_acks_s"), ("reduce_s", "time/reduce_s"),
                  ("send_s", "time/send_s"), ("push_s", "time/push_s"), ("tokens", "queue/tokens"),
                  ("held", "queue/held"), ("used_total", "updates/used"),
                  ("dropped_total", "updates/dropped"), ("staleness", "ps/staleness"))


def check_available():
    """ConfigError (one line) unless ``torch.utils.tensorboard`` can be imported."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ConfigError("--tensorboard needs the tensorboard package: pip install 'hopdec[tensorboard]' "
                          "(or pip install tensorboard)") from None


class TBWriter:
    def __init__(self, log_dir, rank, role):
        from torch.utils.tensorboard import SummaryWriter
        self.w = SummaryWriter(log_dir=os.path.join(log_dir, f"rank{rank}"), flush_secs=10)
        self.rank, self.role = rank, role
        self.jumps = 0
        self._last_push = None
        self._applied = 0

    def record(self, rec):
        step, t = rec["iter"], rec.get("time")
        for key, tag in RECORD_SCALARS:
            v = rec.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
                self.w.add_scalar(tag, v, step, walltime=t)
        if "jumped_from" in rec:
            self.jumps += 1
            self.w.add_scalar("jumps", self.jumps, step, walltime=t)
        if rec.get("t_push") is not None:
            if self._last_push is not None:
                self.w.add_scalar("ps/push_interval_s", rec["t_push"] - self._last_push, step,
                                  walltime=rec["t_push"])
            self._last_push = rec["t_push"]

    def consensus(self, ev):
        self.w.add_scalar("consensus/mean", ev["dist_mean"], ev["at"], walltime=ev["time"])
        self.w.add_scalar("consensus/max", ev["dist_max"], ev["at"], walltime=ev["time"])

    def event(self, name, data):
        t = data.get("time")
        if name == "apply":
            self._applied += 1
            v = data.get("version", self._applied)
            self.w.add_scalar("server/version", v, v, walltime=t)
            if data.get("staleness"):
                self.w.add_scalar("server/staleness", max(data["staleness"]), v, walltime=t)
        elif name == "drop":
            self.w.add_scalar("server/dropped", 1, data.get("version", 0), walltime=t)
        elif name == "eval" and data.get("test_acc") is not None:
            self.w.add_scalar("server/test_acc", data["test_acc"], data.get("version", 0), walltime=t)

    def close(self):
        self.w.close()
