"""Checks of the options that watch a run (``--progress-interval``, ``--consensus-every``,
``--tensorboard``, ``--trace``), made on every rank before training starts."""

import math
import os

from hopdec.errors import ConfigError


def check_observe_options(args, rank=0):
    """Raise ConfigError with one line for a bad value, a missing package or an unwritable file."""
    iv = getattr(args, "progress_interval", None)
    if iv is not None and not (isinstance(iv, (int, float)) and math.isfinite(iv) and iv > 0):
        raise ConfigError(f"--progress-interval {iv}: must be a finite number of seconds > 0")
    every = getattr(args, "consensus_every", None)
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"--consensus-every {every}: must be an integer >= 1")
        if getattr(args, "mode", None) == "ps":
            raise ConfigError("--consensus-every is for decentralized runs (in --mode ps every worker "
                              "starts from the server's model)")
    if (getattr(args, "eval_interval", 0.0) or 0.0) > 0 and getattr(args, "mode", None) != "ps" and not every:
        raise ConfigError("--eval-interval in a decentralized run evaluates the average model that the "
                          "consensus rounds form: give --consensus-every K too")
    if getattr(args, "tensorboard", None):
        from hopdec.observe.tensorboard import check_available
        check_available()
        _writable_dir(args.tensorboard, "--tensorboard")
    trace = getattr(args, "trace", None)
    if trace and rank == 0:
        parent = os.path.dirname(os.path.abspath(trace))
        log_dir = getattr(args, "log_dir", None)
        if log_dir and parent == os.path.abspath(log_dir):
            try:                            # the --log-dir, which setup makes anyway: make it now (a trace
                os.makedirs(parent, exist_ok=True)   # beside the logs was refused unless another rank
            except OSError:                          # happened to make the log dir first)
                pass
        if os.path.isdir(trace) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise ConfigError(f"--trace {trace}: cannot write a file there")


def _writable_dir(d, option):
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{option} {d}: cannot create it ({err.strerror or err})") from None
    if not os.access(d, os.W_OK):
        raise ConfigError(f"{option} {d}: not writable")
