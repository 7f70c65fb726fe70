"""What watches a run and what it leaves behind: logs, saved models, live progress, consensus distance,
evaluations, TensorBoard, a trace. (Whether a directory is writable is checked where the run starts:
:func:`hopdec.observe.options.check_observe_options`, :func:`hopdec.runtime.metrics.check_log_dir`.)"""

from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.settings.base import INT_AT_LEAST_1, SECONDS_NON_NEGATIVE, Group, between, not_empty, option

MAX_PROGRESS_S = 86400.0


@dataclass(frozen=True)
class Observe(Group):
    """The output options (``--log-dir`` ... ``--trace``) and ``--eval-interval``."""

    eval_interval: float = option("--eval-interval", 0.0, SECONDS_NON_NEGATIVE,
                                  "evaluate every SECONDS (0: only at the end)")
    progress_interval: float = option("--progress-interval", None,
                                      between(0, MAX_PROGRESS_S, "a finite number of seconds", low_open=True),
                                      "seconds between progress lines (None: 3)")
    consensus_every: int = option("--consensus-every", None, INT_AT_LEAST_1,
                                  "measure the consensus distance every K iterations")
    log_dir: str = option("--log-dir", None, not_empty("a directory"), "DIR/rank{r}.jsonl, one JSON object per iteration")
    overwrite: bool = option("--overwrite", False, doc="replace the logs an earlier run left in --log-dir")
    save_models: bool = option("--save-models", False, doc="DIR/params_rank{r}.npy (needs --log-dir)")
    progress: bool = option("--no-progress", True, doc="live progress (--no-progress: none)")
    tensorboard: str = option("--tensorboard", None, not_empty("a directory"), "TensorBoard scalars in DIR/rank{r}")
    trace: str = option("--trace", None, not_empty("a file"), "a Chrome/Perfetto trace of every rank")

    def check(self):
        if self.save_models and not self.log_dir:
            raise ConfigError("--save-models needs --log-dir")
        if self.overwrite and not self.log_dir:
            raise ConfigError("--overwrite needs --log-dir (it replaces the logs an earlier run left there)")

    def ignores(self, run):
        # --progress-interval beside --no-progress was accepted and did nothing (typed only: the Python API's
        # default interval stands beside progress=False)
        out = {} if self.progress else {"--progress-interval": "--no-progress prints no progress lines"}
        if run.mode == "decentralized":
            return out
        why = ("the workers' models are identical after every step" if run.mode == "allreduce" else
               "every worker starts each step from the server's model")
        return {**out, "--consensus-every": f"it measures how far the workers' models drift apart, and {why}"}

    def unseen(self, outputs=("--log-dir", "--tensorboard", "--trace")):
        """Notes on options whose results go nowhere: none of the command's ``outputs`` given to write them
        to (a note, not an error: the Python API's callers read the evaluations from what the run returns)."""
        if self.log_dir or self.tensorboard or self.trace:
            return []
        where = ", ".join(outputs[:-1]) + (" or " if len(outputs) > 1 else "") + outputs[-1]
        none = "none is given" if len(outputs) > 1 else "it is not given"
        out = []
        if self.eval_interval:
            out.append(f"--eval-interval {self.eval_interval:g}: the evaluations go to {where}, and {none}: only "
                       f"the last one shows (in the summary)")
        if self.consensus_every:
            out.append(f"--consensus-every {self.consensus_every}: the rounds go to {where}, and {none}: nothing "
                       f"shows them")
        return out

    @property
    def every_s(self):
        """Seconds between live progress lines."""
        return self.progress_interval or 3.0
