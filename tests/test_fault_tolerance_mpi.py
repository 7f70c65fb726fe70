"""Training goes on when workers die (``--fault-tolerance``, ULFM; issue 11), through ``launch/local.sh``
as a user runs it. Every job runs under a timeout (a hang fails the test)."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hopdec.ps.sync import SYNC_MODES
from hopdec.report.gaps import max_iteration_gap
from hopdec.runtime import checkpoint as C

FT = ["--fault-tolerance", "--no-progress", "--threads", "1", "--peer-timeout", "30"]


def records(log_dir, rank):
    """(header, iteration records, events) of ``rank{rank}.jsonl``; whatever is there so far."""
    path = os.path.join(log_dir, f"rank{rank}.jsonl")
    if not os.path.exists(path):
        return None, [], []
    with open(path) as f:
        lines = [json.loads(ln) for ln in f.read().splitlines() if ln.endswith("}")]
    if not lines:
        return None, [], []
    return lines[0], [r for r in lines[1:] if "iter" in r], [r for r in lines[1:] if "event" in r]


def error_lines(out):
    return [ln for ln in out.stderr.splitlines() if ln.startswith("hopdec train: error:")]


def test_two_workers_killed_mid_run_the_survivors_heal_and_finish(mpirun, tmp_path):
    """kill -9 one worker and then a second one of 8 on a directed graph: the six survivors heal twice,
    finish every iteration, their loss keeps falling, their logged gaps stay within the healed graph's
    bound, and the job succeeds with both deaths in its summary."""
    log, iters = str(tmp_path), 120
    args = FT + ["--topology", "topologies/exponential_8.json", "--protocol", "tokens", "--iterations", iters,
                 "--compute-time", "0.03", "--log-dir", log]
    proc = subprocess.Popen([str(c) for c in mpirun.launch_cmd(8, args)], cwd=mpirun.root,
                            env=mpirun.launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 240
    try:
        for victim, at in ((3, 25), (6, 60)):
            while len(records(log, victim)[1]) < at:
                assert proc.poll() is None and time.time() < deadline, "the run ended before the kills"
                time.sleep(0.02)
            os.kill(records(log, victim)[0]["run"]["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=max(1, deadline - time.time()))
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    assert re.search(r"failure: rank\(s\) 3 died near iteration \d+; 7 survivors healed", out), out
    assert re.search(r"failure: rank\(s\) 6 died near iteration \d+; 6 survivors healed", out), out
    healed = int(re.search(r"the gap bound is (\d+) on the healed graph \(6 workers", out).group(1))
    survivors = [0, 1, 2, 4, 5, 7]
    logs = {r: records(log, r) for r in survivors}
    for r, (_, recs, events) in logs.items():
        assert [x["iter"] for x in recs] == list(range(iters)), f"rank {r} missed iterations"
        heals = [e for e in events if e["event"] == "heal"]
        assert [h["failed"] for h in heals] == [[3], [6]], f"rank {r}: {heals}"
        loss = np.array([x["loss"] for x in recs])
        assert loss[-20:].mean() < loss[40:60].mean() < loss[:20].mean(), f"rank {r}: loss did not fall"
    last_heal = max(h["time"] + h["stall_s"] for _, _, ev in logs.values() for h in ev if h["event"] == "heal")
    after = [[(x["time"], x["iter"]) for x in recs if x["time"] > last_heal] for _, recs, _ in logs.values()]
    gap = int(max_iteration_gap(after).max())
    assert gap <= healed + 1, f"gap {gap} after the heals, healed bound {healed}"   # +1: the rebase
    assert "6 workers" in out and out.count("\n   ") >= 6
    # hopdec sim, the same deaths (at the virtual times of those iterations): the same heals (issue 21)
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    sim_log, text = str(tmp_path / "sim"), io.StringIO()
    simulate(parse(["--topology", "topologies/exponential_8.json", "--protocol", "tokens", "--iterations",
                    str(iters), "--compute-time", "0.03", "--fault-tolerance", "--deaths", "3@0.75,6@1.8",
                    "--log-dir", sim_log]), out=text)
    bound = re.compile(r"after the failures the gap bound is .*")
    assert bound.search(text.getvalue()).group(0) == bound.search(out).group(0)
    for r in survivors:
        heals = {}
        for kind, where in (("real", log), ("sim", sim_log)):
            _, recs, events = records(where, r)
            assert [x["iter"] for x in recs] == list(range(iters)), f"{kind} rank {r}"
            heals[kind] = [{k: e[k] for k in ("failed", "survivors", "in_neighbors", "out_neighbors",
                                              "spectral_gap", "notes")} for e in events if e["event"] == "heal"]
        assert heals["real"] == heals["sim"], f"rank {r}"


def test_deaths_while_training_skipping_and_at_shutdown_and_in_the_summary(mpirun, tmp_path):
    """Three of six workers die: one while training with backup workers and jumps, one at shutdown,
    one while the summary is gathered. The three others finish and report."""
    out = mpirun.launch(6, FT + ["--topology", "complete", "--protocol", "tokens", "--backup-workers", 1,
                                 "--staleness", 2, "--skip", "max-jump=3", "--iterations", 40,
                                 "--slowdown", "rank=1,factor=3", "--compute-time", "0.01",
                                 "--die-rank", "1,3,4", "--die-at", "10,0,0",
                                 "--die-phase", "train,shutdown,evaluate", "--log-dir", tmp_path],
                        timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"failure: rank\(s\) 1 died", out.stdout), out.stdout
    assert "(3 workers; it was" in out.stdout and "test accuracy" in out.stdout
    rows = [ln.split() for ln in out.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s", ln)]
    assert sorted(int(r[0]) for r in rows) == [0, 2, 5], out.stdout
    for r in (0, 2, 5):                      # every survivor reached the last iteration (a jump skips some)
        assert records(tmp_path, r)[1][-1]["iter"] == 39


def test_too_few_survivors_to_heal_ends_with_one_line(mpirun):
    out = mpirun.launch(2, FT + ["--protocol", "tokens", "--iterations", 40, "--die-rank", 1, "--die-at", 5],
                        timeout=120)
    lines = error_lines(out)
    assert len(lines) == 1 and "only 1 worker(s) left after the failure of rank(s) 1" in lines[0], out.stderr
    assert out.returncode != 0


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_a_dead_ps_worker_is_dropped_and_the_others_finish(mpirun, sync):
    out = mpirun.launch(4, FT + ["--sync", sync, "--iterations", 30, "--die-rank", 2, "--die-at", 8],
                        timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"failure: worker 2 died after \d+ mini-batches", out.stdout), out.stdout
    assert "2 of 3 workers finished" in out.stdout
    notice = "hopdec: rank 2 (a worker) failed; the server drops it and 2 workers go on"    # when it happens
    assert out.stdout.count(notice) == 1 and out.stdout.index(notice) < out.stdout.index("failure: worker 2")
    rows = [ln.split() for ln in out.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s", ln)]
    assert sorted(int(r[0]) for r in rows) == [1, 3], out.stdout
    if sync == "bsp":
        assert all(int(r[1]) == 30 for r in rows) and "server: 30 updates" in out.stdout


def test_a_ps_run_a_worker_died_in_resumes_on_every_rank_from_before_the_death(mpirun, tmp_path):
    """The survivors went on checkpointing after worker 2 died; they deleted every cut it had (keep_from
    counted only the living), so --resume found no checkpoint complete on every rank and refused the
    directory. Now the dead worker's last cut is kept and the whole job restarts from it."""
    ck, log = tmp_path / "ck", tmp_path / "logs"
    common = FT + ["--sync", "bsp", "--compute-time", "0.01", "--checkpoint-dir", ck, "--log-dir", log]
    out = mpirun.launch(4, common + ["--iterations", 30, "--checkpoint-every", 5, "--die-rank", 2,
                                     "--die-at", 12], timeout=150)
    assert out.returncode == 0 and "2 of 3 workers finished" in out.stdout, out.stderr[-3000:]
    kept = {r: C.read_manifest(str(ck), r)["complete"] for r in range(4)}
    assert max(map(int, kept[2])) in set.intersection(*(set(map(int, k)) for k in kept.values()))
    out = mpirun.launch(4, common + ["--iterations", 40, "--resume", ck], timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "server: 40 updates" in out.stdout, out.stdout          # BSP: every step, all three workers
    rows = [ln.split() for ln in out.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s", ln)]
    assert sorted(int(r[0]) for r in rows) == [1, 2, 3], out.stdout  # (iters run: since the cut)
    assert [r["iter"] for r in records(log, 2)[1]] == list(range(40))  # its log continues from the cut


@pytest.mark.parametrize("dead, phases", [("2", "shutdown"), ("3", "evaluate"), ("1,2,3", "shutdown,evaluate,shutdown")])
def test_ps_workers_that_die_after_training_are_named_and_the_server_still_reports(mpirun, dead, phases):
    """Workers that finish training and then die (at shutdown, or while the summary is gathered) left the
    table without their rows and said nothing; when all of them did, rank 0's summary took the maximum of an
    empty gap matrix and the finished job ended with "rank 0: ValueError: zero-size array" (seen once in
    seven CI runs of the resume test above). Now the summary names them and the server's result stands."""
    out = mpirun.launch(4, FT + ["--sync", "bsp", "--compute-time", "0.01", "--iterations", 20,
                                 "--die-rank", dead, "--die-phase", phases], timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "server: 20 updates" in out.stdout and "server model: test loss" in out.stdout, out.stdout
    gone = [int(w) for w in dead.split(",")]
    says = re.search(r"failure: workers? ([\d, and]+) died after (?:its|their) training ended", out.stdout)
    assert says and [int(w) for w in re.findall(r"\d+", says.group(1))] == gone, out.stdout
    rows = [ln.split() for ln in out.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s", ln)]
    assert sorted(int(r[0]) for r in rows) == sorted({1, 2, 3} - set(gone)), out.stdout
    assert all(int(r[1]) == 20 for r in rows)
    assert "workers finished" not in out.stdout         # nobody died while training
    if not rows:                                        # no row to measure a gap or name an emulation in
        assert "largest iteration gap observed: none (no worker row)" in out.stdout, out.stdout
        assert "times: measured; what was emulated went with the workers" in out.stdout, out.stdout


LATE_ROOT = """
import sys, time
from hopdec.transport import collectives
real, calls = collectives._wait, []

def late(comm, req, timeout, what):     # rank 0 starts the summary's gather (its 2nd step) 3 s late
    out = real(comm, req, timeout, what)
    if what == "gathering the summary" and comm.Get_rank() == 0:
        calls.append(what)
        if len(calls) == 1:
            time.sleep(3)
    return out
collectives._wait = late
from hopdec.cli.main import main
sys.exit(main())
"""


@pytest.mark.parametrize("mode", [["--sync", "bsp"], ["--topology", "ring"]])
def test_ranks_leave_a_fault_tolerant_job_only_after_rank_0_has_its_summary(mpirun, tmp_path, mode):
    """A fault-tolerant rank exits without MPI_Finalize, which ULFM counts as a failure; the others did so
    as soon as their part of the summary's gather was sent. Rank 0, still finishing it on a loaded machine,
    then found all of them failed and lost their rows: a finished job ended "rank 0: ValueError: zero-size
    array" (PS; seen once in seven CI runs) or "only 1 worker(s) left" (decentralized). Rank 0 here starts
    the gather's second step 3 s late; the others now wait until it is done with them."""
    script = tmp_path / "late_root.py"
    script.write_text(LATE_ROOT)
    env = mpirun.env(HOPDEC_CMD=f"{sys.executable} {script} train")
    out = mpirun.launch(4, FT + mode + ["--compute-time", "0.01", "--iterations", 10], timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [ln.split() for ln in out.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s", ln)]
    assert sorted(int(r[0]) for r in rows) == ([1, 2, 3] if "--sync" in mode else [0, 1, 2, 3]), out.stdout
    assert "failure" not in out.stdout, out.stdout


@pytest.mark.parametrize("mode", [["--protocol", "tokens"], ["--sync", "asp"]], ids=["hop", "ps"])
def test_an_error_on_a_fault_tolerant_rank_ends_the_job_with_its_line_alone(mpirun, mode):
    """Rank 1 raises: its line ends the job (exit 3). Under ULFM the others saw its MPI_Abort as a death
    first: they healed, said "rank(s) 1 failed; 3 survivors go on", trained on, and took the abort's SIGTERM
    as a stop ("stopped at iteration 18 of 200 (SIGTERM)"): three lines where one was said. A rank whose
    failure notice arrived is ending the job: the others now leave quietly instead of healing."""
    out = mpirun.launch(4, FT + mode + ["--peer-timeout", 45, "--compute-time", "0.02", "--iterations", 300, "--die-rank", 1,
                                        "--die-at", 5, "--die-how", "raise"], timeout=120)
    assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-2000:]
    said = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("hopdec")]
    assert said == ["hopdec train: error: rank 1: RuntimeError: injected failure in train (HOPDEC_DEBUG=1 "
                    "shows the traceback)"], out.stdout[-2000:] + out.stderr[-2000:]


def test_a_dead_parameter_server_ends_the_job_with_one_line(mpirun):
    out = mpirun.launch(4, FT + ["--sync", "asp", "--iterations", 400, "--die-rank", 0, "--die-at", 20],
                        timeout=120)
    lines = error_lines(out)
    assert len(lines) == 1 and "the parameter server (rank 0) died" in lines[0], out.stderr
    assert out.returncode != 0


@pytest.mark.parametrize("env, peer, says", [
    ({}, 30, None),                                                         # no detector known: nothing to say
    ({"OMPI_MCA_mpi_ft_detector_timeout": "30"}, 30, "--peer-timeout 30 s is not above the failure detector's 30 s"),
    ({"OMPI_MCA_mpi_ft_detector_timeout": "30"}, 12.5, "--peer-timeout 12.5 s is not above"),
    ({"OMPI_MCA_mpi_ft_detector_timeout": "30"}, 31, None),
    ({"OMPI_MCA_mpi_ft_detector_timeout": "3"}, 30, None),
    ({"OMPI_MCA_mpi_ft_detector_timeout": "lots"}, 30, None)])
def test_a_peer_timeout_not_above_the_failure_detectors_is_a_note(monkeypatch, env, peer, says):
    """A hung rank is found only by ULFM's detector (HOPDEC_FT_TIMEOUT after its last heartbeat); a rank
    waiting on it gives up after the peer timeout, ending the job. With --peer-timeout 30 and the detector's
    default 30, a PS worker under SSP held back by a stopped worker gave up first (1 of 20 random runs): the
    job the option asked to survive ended with exit 3, and nothing had said the two timeouts raced."""
    from hopdec.runtime.failures import slow_detector_note
    monkeypatch.delenv("OMPI_MCA_mpi_ft_detector_timeout", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got = slow_detector_note(peer, 3)
    assert slow_detector_note(peer, 1) is None                      # one rank: nobody to wait on
    if says is None:
        assert got is None
    else:
        assert got.startswith(says) and "HOPDEC_FT_TIMEOUT" in got and "more than 30 s" in got


def test_a_fault_tolerant_job_says_once_when_its_peer_timeout_races_the_detector(mpirun, tmp_path):
    """`hopdec train --fault-tolerance --peer-timeout 20` under the launcher (detector 30 s): rank 0 notes it
    once, and the run goes on; --peer-timeout 60 says nothing."""
    args = ["--fault-tolerance", "--no-progress", "--threads", "1", "--iterations", 3]
    out = mpirun.launch(3, args + ["--peer-timeout", 20], timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    notes = [ln for ln in out.stderr.splitlines() if "failure detector" in ln]
    assert notes == ["hopdec train: note: --peer-timeout 20 s is not above the failure detector's 30 s "
                     "(HOPDEC_FT_TIMEOUT): a rank waiting on a hung one may give up, ending the job, before the "
                     "detector declares the hung rank dead and the survivors heal; give --peer-timeout more than "
                     "30 s (its default, 120, is)"], out.stderr
    out = mpirun.launch(3, args + ["--peer-timeout", 60], timeout=120)
    assert out.returncode == 0 and "failure detector" not in out.stderr, out.stderr[-3000:]


def test_a_fault_tolerant_job_whose_every_rank_died_is_a_failure(mpirun):
    """Every rank of a --fault-tolerance job dies (exit 17 at an injected death): Open MPI's launcher exits
    0 for a fault-tolerant job whatever its ranks' exits, so the job ended 0 without a word. Each hopdec rank
    now marks its start in the launcher's exit-code file; with no clean finish and no code after the marks,
    the launcher says so in one line and exits 3."""
    out = mpirun.launch(3, FT + ["--iterations", 20, "--die-rank", "0,1,2", "--die-at", "2,2,2"], timeout=120)
    assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stderr.splitlines()[-1] == ("local.sh: error: no rank of this --fault-tolerance job finished: every one "
                                           "ended without a word (killed, crashed or exited early; Open MPI exits "
                                           "0 for such a job)"), out.stderr


def test_the_exit_file_marks_never_overwrite_a_code(tmp_path, monkeypatch):
    """A start appends ``-``; a clean finish writes 0 unless a code is there; a failure's code overwrites
    (what run_job reads: digits are the code; only dashes, a job nobody finished)."""
    from hopdec.runtime.failures import record_exit, record_finished, record_started
    f = tmp_path / "exit"
    f.write_text("")
    monkeypatch.setenv("HOPDEC_EXIT_FILE", str(f))
    record_started()
    record_started()
    assert f.read_text() == "--"
    record_exit(3)
    record_finished()
    assert f.read_text() == "3\n"
    f.write_text("-")
    record_finished()
    assert f.read_text() == "0\n"
    record_started()                    # (a late start after a finish: the code stays readable)
    assert f.read_text() == "0\n-"
    g = tmp_path / "gone"
    monkeypatch.setenv("HOPDEC_EXIT_FILE", str(g))
    record_started()
    record_finished()
    assert not g.exists()               # never made: only the launcher's own file is written
