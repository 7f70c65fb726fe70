"""What a run measured: per-rank JSONL logs, the observed iteration gap, and the rank-0 summary table.

Each rank writes ``DIR/rank{r}.jsonl``, one JSON object per iteration (see :mod:`hopdec.runtime.hop_loop`), with
``time`` taken when the worker entered the iteration (``time.time()``, before it sent anything, so the
order of log times respects the order of messages on one machine).
"""

import contextlib
import json
import os
import socket

from hopdec.files import write_failed, writing


def log_path(log_dir, rank):
    return os.path.join(log_dir, f"rank{rank}.jsonl")


def check_log_dir(log_dir, rank):
    """Raise ConfigError unless this rank can write ``DIR/rank{r}.jsonl`` (run during setup, so a bad
    ``--log-dir`` is one line before training instead of a failure on one rank mid-run). The file it
    made to try is removed again, so a run refused by a later check leaves no empty log that looks like a
    run's (the folder stays: the ranks share it, and one rank's removal would race another's check)."""
    import stat

    from hopdec.errors import ConfigError
    path = log_path(log_dir, rank)
    existed = os.path.lexists(path)
    try:
        os.makedirs(log_dir, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o644)  # a FIFO: no wait
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        if not existed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    except OSError as err:
        if os.path.exists(log_dir) and not os.path.isdir(log_dir):
            raise ConfigError(f"--log-dir {log_dir}: is a file, not a directory") from None
        regular = not os.path.exists(path) or stat.S_ISREG(os.stat(path).st_mode)
        if regular:
            raise ConfigError(f"--log-dir {log_dir}: cannot write {path} ({err.strerror or err})") from None
    if not regular:
        raise ConfigError(f"--log-dir {log_dir}: {path} is not a regular file (a FIFO or device would "
                          f"block or swallow the log)")


def open_jsonl(log_dir, rank, header, append=False):
    """``DIR/rank{r}.jsonl``, line-buffered (every record reaches the file as it is written, so a killed
    rank loses at most the record being written), with the run header first (plus this process's pid
    and host, so a user can tell which process is which rank; and the emulated network's conditions,
    ``network``, under a testbed: :func:`hopdec.launcher.network_conditions`). ``append``: a resumed run continues the
    log (its header line marks where)."""
    from hopdec.launcher import network_conditions as conditions
    os.makedirs(log_dir, exist_ok=True)
    header = {**(header or {}), "pid": os.getpid(), "host": socket.gethostname()}
    net = conditions()              # an emulated network (hopdec.testbed) says what its links were
    if net is not None:
        header.setdefault("network", net)
    path = log_path(log_dir, rank)
    with writing(path):
        f = open(path, "a" if append else "w", buffering=1)
        f.write(json.dumps({"rank": rank, "run": header}) + "\n")
    return f


class _JsonlFile:
    """A ``rank{r}.jsonl`` being written (``_f``, ``path``; ``_f`` None: no log, or closed)."""

    _closed_at = 0          # the file's size once closed

    def _line(self, obj):
        if self._f:
            with writing(self.path):
                self._f.write(json.dumps(obj) + "\n")

    def tell(self):
        """Bytes written so far (every record complete: the file is line-buffered); once closed, the whole
        file's (a checkpoint taken after the end)."""
        if self._f is None:
            return self._closed_at
        self._f.flush()
        return self._f.tell()

    def close(self):
        if self._f:
            f, self._f = self._f, None
            with writing(self.path):
                f.flush()
                self._closed_at = f.tell()
                f.close()


class RankLogger(_JsonlFile):
    """Writes one rank's iteration records and keeps what the summary needs."""

    def __init__(self, log_dir, rank, header=None, append=False, entries=True):
        """``entries=False``: do not keep every iteration's (time, iteration) -- the summary's iteration
        gap replays them; a simulator that measures the gap itself would hold 10 million of them."""
        self.rank = rank
        self.path = None
        self._f = None
        if log_dir:
            self.open(log_dir, header, append)
        self.entries = [] if entries else None     # (time, iter) of every iteration entered
        self.iterations = 0
        self.wait_s = 0.0
        self.compute_s = 0.0
        self.last_loss = None
        self.first_time = self.last_time = None
        self.first_iter = self.last_iter = None     # progress counts skipped iterations too
        self.jumps = 0

    def open(self, log_dir, header=None, append=False):
        """Start writing ``DIR/rank{r}.jsonl`` (:func:`open_jsonl`): at construction, or later for a writer
        that learns only then whether it continues an earlier log (``hopdec.optim.HopOptimizer``)."""
        self.path = log_path(log_dir, self.rank)
        self._f = open_jsonl(log_dir, self.rank, header, append=append)

    def log(self, rec):
        t, it = rec["time"], rec["iter"]
        if self.entries is not None:
            self.entries.append((t, it))
        self.iterations += 1
        self.wait_s += rec.get("wait_s", 0.0)
        self.compute_s += rec.get("compute_s", 0.0)
        loss = rec.get("loss")
        if loss is not None:
            self.last_loss = loss
        if self.first_time is None:
            self.first_time, self.first_iter = t, it
        self.last_time, self.last_iter = t, it
        if "jumped_from" in rec:
            self.jumps += 1
        if self._f:
            try:
                self._f.write(json.dumps(rec) + "\n")
            except OSError as err:      # a full disk: one line naming the file (inline: every record)
                raise write_failed(self.path, err) from None

    def event(self, name, **data):
        """A line that is not an iteration record: ``{"event": name, ...}`` (no ``iter`` key, so
        :func:`read_log` skips it), e.g. a heal, a consensus-distance round or what observing cost."""
        self._line(dict(event=name, **data))

    @property
    def progress_rate(self):
        """Iterations advanced per second between the first and the last iteration entered (a jump
        counts with its length), or None before two iterations."""
        if self.iterations < 2 or self.last_time == self.first_time:
            return None
        return (self.last_iter - self.first_iter) / (self.last_time - self.first_time)


class EventLog(_JsonlFile):
    """The parameter server's ``rank0.jsonl``: the run header, then its events (``apply``, ``drop``,
    ``release``, ``stop``, ``note``, ``eval``, ``summary``; no ``iter`` key, so :func:`read_log` skips them).
    Called as ``events(name, **data)``."""

    def __init__(self, log_dir, header, append=False):
        self._f = open_jsonl(log_dir, 0, header, append=append) if log_dir else None
        self.path = log_path(log_dir, 0) if log_dir else None

    def __call__(self, event, **data):
        self._line(dict(event=event, **data))


def read_log(path):
    """The iteration records of one ``rank{r}.jsonl`` (the header line is skipped)."""
    with open(path) as f:
        return [r for r in map(json.loads, f) if "iter" in r]


def format_table(headers, rows):
    """A plain text table with right-aligned columns."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c):
    if isinstance(c, float):
        return f"{c:.4g}"
    return "-" if c is None else str(c)
