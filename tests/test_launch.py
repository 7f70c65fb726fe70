"""launch/local.sh starts N MPI ranks on one box and runs HOPDEC_CMD (or hopdec train) on each."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL = os.path.join(ROOT, "launch", "local.sh")
HOSTFILE = os.path.join(ROOT, "launch", "hostfile.sh")

PRINT_RANK = (f"{sys.executable} -c 'import sys; from mpi4py import MPI; "
              "c = MPI.COMM_WORLD; print(\"rank\", c.rank, \"of\", c.size, sys.argv[1:])'")


def _run(args, **env):
    return subprocess.run(["bash", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, cwd="/")


@pytest.mark.mpi
def test_local_runs_every_rank_with_args():
    r = _run([LOCAL, "-n", "2", "--", "x", "y z"], HOPDEC_CMD=PRINT_RANK)
    assert r.returncode == 0, r.stderr
    lines = sorted(line for line in r.stdout.splitlines() if line.startswith("rank"))
    assert lines == ["rank 0 of 2 ['x', 'y z']", "rank 1 of 2 ['x', 'y z']"]


@pytest.mark.mpi
def test_hostfile_on_localhost(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("localhost slots=2\n")
    r = _run([HOSTFILE, "-f", str(hf), "-n", "2"], HOPDEC_CMD=PRINT_RANK)
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[1] for line in r.stdout.splitlines() if line.startswith("rank")) == ["0", "1"]


def test_usage_and_bad_arguments(tmp_path):
    for script in (LOCAL, HOSTFILE):
        r = _run([script, "-h"])
        assert r.returncode == 0 and r.stdout.startswith("usage:")
    r = _run([LOCAL, "-n", "zero"])
    assert r.returncode == 2 and "-n zero" in r.stderr
    r = _run([HOSTFILE, "-n", "2"])
    assert r.returncode == 2 and "HOSTFILE is required" in r.stderr
    r = _run([HOSTFILE, "-f", str(tmp_path / "nope"), "-n", "2"])
    assert r.returncode == 2 and "nope" in r.stderr
    r = _run(["-n", os.path.join(ROOT, "launch", "slurm.sbatch")])  # bash -n: syntax check
    assert r.returncode == 0, r.stderr
