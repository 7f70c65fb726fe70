"""The smaller hostile cases of issue 17 (items 10 and 12), each one line and a non-zero exit, never a
traceback or a run that goes on for hours."""

import os
import subprocess
import sys

import pytest

from hopdec.cli.main import main
from hopdec.errors import ConfigError, HopdecError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_one_error(capsys, code, *words):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ": error: " in ln]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines
    return lines[0]


# ---- item 10: sizes checked before anything is built ---------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["topo", "generate", "complete", "-n", "100000"], ["complete(100000)", "GiB of memory"]),
    (["topo", "generate", "ring", "-n", "10000000"], ["ring(10000000)", "more than hopdec handles"]),
    (["topo", "generate", "hierarchical-a", "--machines", "60000,60000"], ["120000 workers"]),
    (["sim", "--mode", "ps", "-n", "1000000", "--iterations", "5"], ["-n 1000000", "more than hopdec handles"]),
    (["sim", "--topology", "exponential", "-n", "200000", "--iterations", "5"], ["-n 200000"]),
])
def test_sizes_no_machine_can_build_are_refused_at_once(tmp_path, capsys, argv, words):
    argv = argv + (["-o", str(tmp_path / "g.json")] if argv[0] == "topo" else [])
    assert_one_error(capsys, main(argv), *words)


# ---- item 12 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e39"])
def test_non_finite_features_are_the_files_fault_not_the_learning_rates(tmp_path, value):
    """A LIBSVM file with a NaN, an infinity or a value float32 cannot hold: refused naming the file and
    the sample, where training used to end in "training diverged" (blaming the learning rate)."""
    from hopdec.ml.data import load_dataset
    f = tmp_path / "d.svm"
    f.write_text("".join(f"{1 if i % 2 else -1} 1:0.5 2:{value if i == 3 else '0.25'}\n" for i in range(8)))
    with pytest.raises(ConfigError) as err:
        load_dataset("libsvm", path=str(f))
    assert str(f) in str(err.value) and "sample 4" in str(err.value) and "finite" in str(err.value)


def test_an_empty_topology_path_says_so(capsys):
    from hopdec.topology import load
    with pytest.raises(HopdecError, match="an empty topology path"):
        load("")
    assert_one_error(capsys, main(["topo", "analyze", ""]), "empty topology path")


@pytest.mark.parametrize("weights", [
    ["0 1 1e-320", "1 0 5e-324", "0 0 1", "1 1 1"],
    ["0 0 1.7e308", "0 1 1e308", "1 0 5e-324", "1 1 1e-310", "0 2 1", "2 0 2.2e-308", "2 2 1e-300",
     "1 2 1", "2 1 1"],
])
def test_subnormal_and_huge_weights_are_analysed_not_a_linalg_traceback(tmp_path, capsys, weights):
    """Weights 1e200 times smaller than their column's largest count as 0 (a warning says so): normalising
    them gave subnormals whose reciprocals overflowed into numpy's LinAlgError."""
    f = tmp_path / "w.txt"
    f.write_text("\n".join(weights) + "\n")
    code = main(["topo", "analyze", str(f)])
    out = capsys.readouterr()
    assert code == 0 and "Traceback" not in out.err and "spectral gap" in out.out
    assert "count as 0" in out.err


def test_a_graph_cut_by_weights_that_count_as_0_says_so(tmp_path, capsys):
    """Node 2's out-weights (1) are 1e300 times smaller than its receivers' other in-weight: they count as 0,
    so the graph is not strongly connected. The refusal said "node 2 sends to no other worker (no out-edge
    of positive weight)" alone, contradicting the file (its weights are positive); it now says why."""
    f = tmp_path / "huge.txt"
    f.write_text("0 1 1e300\n1 0 1e300\n1 2 1\n2 1 1\n2 0 1\n0 2 1\n")
    line = assert_one_error(capsys, main(["sim", "--topology", str(f), "--iterations", "2", "--no-progress"]),
                            str(f), "not strongly connected")
    assert "times smaller" in line and "count as 0" in line


def test_sim_log_dir_that_is_a_file_or_a_fifo(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert_one_error(capsys, main(["sim", "--topology", "ring", "-n", "4", "--iterations", "3", "--log-dir", str(f)]),
               str(f), "is a file, not a directory")
    d = tmp_path / "logs"
    d.mkdir()
    os.mkfifo(d / "rank0.jsonl")                  # opening it for writing used to wait for a reader forever
    assert_one_error(capsys, main(["sim", "--topology", "ring", "-n", "4", "--iterations", "3", "--log-dir", str(d)]),
               "not a regular file")


def test_a_closed_pipe_is_not_a_traceback():
    """``hopdec topo analyze FILE | head``: the reader went away; the command ends quietly (141, as a
    process SIGPIPE ends), where it printed a BrokenPipeError traceback. The pipe's read end is closed
    before the command starts, so the write always finds it gone."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "hopdec.cli", "topo", "analyze",
                               os.path.join(ROOT, "topologies", "ring_based_16.json")],
                              stdout=w, stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT)
    finally:
        os.close(w)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("env_kept", [False, True], ids=["plain", "root-env"])
def test_a_single_rank_job_that_fails_prints_its_one_line_and_no_abort_box(env_kept):
    """One rank without mpirun: an abort's notice came as "help-mpi-api.txt: No such file" (the wheel's
    prefix unknown to a process mpirun did not start), later as Open MPI's ten-line MPI_ABORT box under the
    job's line. A job of one process has nobody else to end: it exits with the code, the line alone.
    ``root-env``: with ``OMPI_ALLOW_RUN_AS_ROOT`` set, as a root user has it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_PREFIX"))}
    if env_kept:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([sys.executable, "-m", "hopdec.cli", "train", "--no-progress", "--threads", "1",
                           "--iterations", "3", "--die-rank", "0", "--die-how", "raise"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 3
    assert [ln for ln in proc.stderr.splitlines() if "note: running 1 worker" not in ln] == [
        "hopdec train: error: rank 0: RuntimeError: injected failure in train (HOPDEC_DEBUG=1 shows the "
        "traceback)"], proc.stderr[-2000:]


def test_a_bad_option_with_fault_tolerance_on_one_rank_is_one_line():
    """``hopdec train --fault-tolerance`` with a bad option and no mpirun: the line came with Open MPI's
    "Sorry! You were supposed to get help about: mpi-abort" box (the abort that ends a fault-tolerant
    job of several ranks, in a process whose MPI knew no help files)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_PREFIX"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([sys.executable, "-m", "hopdec.cli", "train", "--fault-tolerance", "--iterations", "0"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["hopdec train: error: --iterations 0: must be an integer in [1, 1e+09]"], \
        proc.stderr[-2000:]
