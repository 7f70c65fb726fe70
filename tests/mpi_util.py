"""Running real ``mpirun`` jobs from tests: a timeout turns a hang into a failure, never a stuck CI."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpi_env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def mpirun(n, args, timeout=180):
    """``mpirun -n N python -m hopdec.cli ARGS``; returns the CompletedProcess (stdout+stderr text)."""
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(n),
           sys.executable, "-m", "hopdec.cli"] + [str(a) for a in args]
    return subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=timeout)


def topo_bounds(path, max_ig=None, staleness=None):
    """``hopdec topo analyze --json``'s Table 1 bounds for a file (what the user would read)."""
    cmd = [sys.executable, "-m", "hopdec.cli", "topo", "analyze", path, "--json"]
    if max_ig is not None:
        cmd += ["--max-ig", str(max_ig)]
    if staleness is not None:
        cmd += ["--staleness", str(staleness)]
    out = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["gap_bounds"]
