"""What the observers need from this host before training starts: the TensorBoard package and a writable
directory for it, a writable place for the trace. (The values' ranges and the rules between them are the
settings' own checks: :class:`hopdec.settings.Observe`, :class:`hopdec.settings.RunSettings`.)"""

import os

from hopdec.errors import ConfigError


def check_observe_options(observe, rank=0):
    """Raise ConfigError with one line for a missing package or an unwritable file (``observe``:
    :class:`hopdec.settings.Observe`)."""
    if observe.tensorboard:
        from hopdec.observe.tensorboard import check_available
        check_available()
        _writable_dir(observe.tensorboard, "--tensorboard")
    trace = observe.trace
    if trace and rank == 0:
        parent = os.path.dirname(os.path.abspath(trace))
        log_dir = observe.log_dir
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
