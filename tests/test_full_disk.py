"""A disk that fills up while a run writes (a cluster's scratch space, a quota) ends the run with one line
naming the file, not a traceback: logs, checkpoints, saved models and results (:func:`hopdec.files.writing`)."""

import os
import re
import subprocess
import sys

import pytest

from hopdec.errors import RunError
from hopdec.runtime.metrics import RankLogger

NO_SPACE = "No space left on device"


def test_a_log_that_cannot_be_written_names_its_file(tmp_path):
    """/dev/full answers every write with ENOSPC (no root needed): the rank's log line names the file."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    os.symlink("/dev/full", tmp_path / "rank0.jsonl")
    with pytest.raises(RunError, match=f"^cannot write {tmp_path}/rank0.jsonl: {NO_SPACE}$"):
        RankLogger(str(tmp_path), 0, header={"run_id": "x"})


def test_hopdec_sim_on_a_full_disk_is_one_line(full_disk):
    fs = full_disk("16k")
    r = subprocess.run([sys.executable, "-m", "hopdec.cli", "sim", "-n", "64", "--iterations", "50",
                        "--log-dir", str(fs / "s")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hopdec sim: error: cannot write {fs}/s/rank"), r.stderr
    assert lines[0].endswith(f".jsonl: {NO_SPACE}"), r.stderr


COMMON = ["train", "--no-progress", "--threads", "1", "--peer-timeout", 20]


def _errors(out):
    return [ln for ln in out.stderr.splitlines() if ln.startswith("hopdec train: error:")]


def test_hopdec_train_logs_on_a_full_disk_end_the_job_with_one_line(mpirun, full_disk):
    """The logs fill 64 KiB after some 60 iterations: the rank whose write failed names its file, and every
    rank ends (before: ``OSError: [Errno 28] No space left on device``, no file named)."""
    fs = full_disk("64k")
    out = mpirun(4, COMMON + ["--iterations", 400, "--log-dir", fs / "run"], timeout=120)
    assert out.returncode != 0
    lines = _errors(out)
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    rank = lines[0].split("rank ")[1].split(":")[0]
    assert lines[0] == f"hopdec train: error: rank {rank}: cannot write {fs}/run/rank{rank}.jsonl: {NO_SPACE}", \
        lines


def test_checkpoints_on_a_full_disk_name_the_file_and_leave_no_part(mpirun, full_disk):
    """Checkpoints of 4 ranks do not fit in 3 MiB: one line names the file that failed; no temporary
    file is left beside the checkpoints that were written, and a resume says the directory is incomplete."""
    fs = full_disk("3m")
    ck = fs / "ck"
    out = mpirun(4, COMMON + ["--iterations", 400, "--checkpoint-dir", ck, "--checkpoint-every", 50],
                 timeout=120)
    assert out.returncode != 0
    lines = _errors(out)
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert re.search(rf": cannot write {re.escape(str(ck))}/rank\d/(ckpt-\d+\.npz|manifest\.json): {NO_SPACE}$",
                     lines[0]), lines                  # (the checkpoint, or the manifest that lists it)
    left = [os.path.join(d, f) for d, _, fs_ in os.walk(ck) for f in fs_]
    assert left and not [f for f in left if ".tmp" in f], left


@pytest.mark.parametrize("kind", ["exponential", "one-peer-exponential"])
def test_topo_generate_on_a_full_disk_keeps_the_file_it_would_have_replaced(full_disk, kind):
    """``topo generate`` wrote its JSON in place: a disk that filled up mid-write (or Ctrl-C) left a part of
    a file where a good topology had been. Now the file is written whole or not at all: one line, the old
    file intact, no temporary file left beside it."""
    from hopdec import topology as T
    fs = full_disk("64k")
    path = fs / "g.json"
    T.save(T.ring(4), str(path))
    before = path.read_bytes()
    r = subprocess.run([sys.executable, "-m", "hopdec.cli", "topo", "generate", kind, "-n", "2048", "-o", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot write {path}: {NO_SPACE}" in lines[0], r.stderr
    assert path.read_bytes() == before
    assert sorted(os.listdir(fs)) == ["g.json"]
