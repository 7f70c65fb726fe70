"""Watching real runs: live progress under a pseudo-terminal, consensus distance, trace, TensorBoard, report.

One ``mpirun`` job (4 ranks, run under a pseudo-terminal as a user's shell would) trains twice through a
small driver: a decentralized run with every observer on, then a parameter-server run (1 server + 3
workers). Every check reads that job's output, with the arrival time of each line, and its logs.
"""

import glob
import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import ROOT, mpi_env

N = 4
ITERS = 50
EVERY = 5
DRIVER = """
import json, sys
from hopdec.cli.train import main
for argv in json.loads(sys.argv[1]):
    rc = main(argv)
    if rc:
        sys.exit(rc)
"""
PROGRESS = re.compile(r"^progress\s+([\d.]+) s\s+(?:iter|mini-batch) (\d+)(?:\.\.(\d+))? of (\d+) .*?gap (\d+)"
                      r"(?: \(bound (\d+)\))?")


def run_in_pty(cmd, timeout, env):
    """Run ``cmd`` with stdout and stderr on a pseudo-terminal; returns (rc, [(arrival time, line)])."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    lines, buf = [], b""

    def reader():
        nonlocal buf
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:                       # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            now = time.time()
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                lines.append((now, line.decode(errors="replace").rstrip("\r")))
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"hung for {timeout} s: {' '.join(cmd)}\n" + "\n".join(x for _, x in lines[-40:]))
    t.join(5)
    os.close(master)
    return rc, lines


@pytest.fixture(scope="module")
def job(mpirun, tmp_path_factory):
    base = tmp_path_factory.mktemp("observe")
    driver = base / "driver.py"
    driver.write_text(DRIVER)
    hop, ps = base / "hop", base / "ps"
    common = ["--threads", "1", "--progress-interval", "0.5", "--compute-time", "0.04"]
    runs = [common + ["--iterations", str(ITERS), "--slowdown", "rank=3,factor=2", "--log-dir", str(hop),
                      "--consensus-every", str(EVERY), "--eval-interval", "0.5", "--save-models",
                      "--trace", str(hop / "trace.json"),
                      "--tensorboard", str(hop / "tb")],
            common + ["--sync", "ssp", "--staleness", "1", "--iterations", "60", "--slowdown", "rank=1,factor=2",
                      "--eval-interval", "0.5", "--log-dir", str(ps), "--trace", str(ps / "trace.json")]]
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(N), sys.executable, str(driver),
           json.dumps(runs)]
    rc, lines = run_in_pty(cmd, 300, mpi_env())
    return dict(rc=rc, lines=lines, hop=hop, ps=ps, text="\n".join(x for _, x in lines))


def _records(d):
    out = {}
    for f in glob.glob(os.path.join(d, "rank*.jsonl")):
        rows = [json.loads(x) for x in open(f)]
        out[int(re.search(r"rank(\d+)", f).group(1))] = rows
    return out


def _segment(lines, start_marker, end_marker):
    """The lines between the first line containing ``start_marker`` (or the start) and ``end_marker``."""
    out, on = [], start_marker is None
    for t, x in lines:
        if not on and start_marker in x:
            on = True
            continue
        if on and end_marker in x:
            return out, t
        if on:
            out.append((t, x))
    raise AssertionError(f"no {end_marker!r} in the output")


def _check_progress(seg, log_dir, what):
    seg = [(t, x) for t, x in seg if x.startswith("progress")]
    assert re.fullmatch(r"progress\s+[\d.]+ s\s+all \d+ workers finished", seg[-1][1]), seg[-1]
    prog = [(t, PROGRESS.match(x)) for t, x in seg[:-1]]
    assert len(prog) >= 3, (what, [x for _, x in seg])
    assert all(m for _, m in prog), [x for _, x in seg if x.startswith("progress")]
    # arrival times: while training ran, not at exit -- the first line came well before the last
    # iteration any worker entered (both times are this machine's clock), and lines kept coming
    last_iter_time = max(r["time"] for rows in _records(log_dir).values() for r in rows if "iter" in r)
    first, last = prog[0][0], prog[-1][0]
    assert first < last_iter_time - 1.0, (what, first, last_iter_time)
    assert last - first >= 1.0, (what, first, last)
    lows = [int(m.group(2)) for _, m in prog]
    highs = [int(m.group(3) or m.group(2)) for _, m in prog]     # "iter 61 of 150 (every worker)": no range
    assert lows == sorted(lows) and highs == sorted(highs) and all(lo <= hi for lo, hi in zip(lows, highs))
    for _, m in prog:                             # the gap printed is a gap at one instant: within the bound
        if m.group(6) is not None:
            assert int(m.group(5)) <= int(m.group(6)), m.group(0)
    return prog


def test_job_succeeds(job):
    assert job["rc"] == 0, job["text"][-4000:]


def test_progress_is_live_under_mpirun_decentralized(job):
    seg, _ = _segment(job["lines"], None, "== decentralized")
    prog = _check_progress(seg, job["hop"], "decentralized")
    assert all(int(m.group(4)) == ITERS for _, m in prog)
    assert not any("\r" in x for _, x in job["lines"])          # lines, not a bar redrawn in place


def test_progress_is_live_under_mpirun_ps(job):
    seg, _ = _segment(job["lines"], "== decentralized", "== parameter server")
    prog = _check_progress(seg, job["ps"], "ps")
    assert all("server v" in m.string for _, m in prog)


def test_consensus_distance_matches_the_final_models(job):
    rows = _records(job["hop"])[0]
    ev = [r for r in rows if r.get("event") == "consensus"]
    assert [e["at"] for e in ev] == list(range(EVERY, ITERS, EVERY)) + [ITERS]
    for e in ev:
        assert len(e["dists"]) == N and 0 < e["dist_mean"] <= e["dist_max"]
        assert e["dist_max"] == pytest.approx(max(e["dists"]), rel=1e-6)
    # the end-of-training round measured the models each rank saved: recompute it from them
    x = np.stack([np.load(job["hop"] / f"params_rank{r}.npy") for r in range(N)]).astype(np.float64)
    d = np.linalg.norm(x - x.mean(axis=0), axis=1)
    np.testing.assert_allclose(ev[-1]["dists"], d, rtol=1e-3)
    assert ev[-1]["end"] is True
    cost = [r for rs in _records(job["hop"]).values() for r in rs if r.get("event") == "observer"]
    assert len(cost) == N and all(c["consensus"] and c["progress"] for c in cost)


def test_average_model_evaluated_during_a_decentralized_run(job):
    ev = [json.loads(x) for x in open(job["hop"] / "eval.jsonl")]
    assert len(ev) >= 2 and ev[-1]["final"] is True and ev[-1]["at"] == ITERS
    assert [e["time"] for e in ev] == sorted(e["time"] for e in ev)
    # the end round's average is the model the summary evaluates
    summary = [r for r in _records(job["hop"])[0] if r.get("event") == "summary"][0]
    assert ev[-1]["test_acc"] == pytest.approx(summary["test_acc"], abs=1.5 / 360)
    assert ev[-1]["test_loss"] == pytest.approx(summary["test_loss"], rel=1e-3)
    assert ev[-1]["test_acc"] > ev[0]["test_acc"]


def test_time_breakdown_says_who_waits_for_whom(job):
    recs = {r: [x for x in rows if "iter" in x] for r, rows in _records(job["hop"]).items()}
    for r, rs in recs.items():
        for x in rs:
            parts = sum(x.get(k, 0.0) for k in ("wait_updates_s", "wait_tokens_s", "wait_acks_s"))
            assert parts == pytest.approx(x["wait_s"], abs=1e-9)
            assert x["send_s"] >= 0 and x["reduce_s"] > 0 and x["apply_s"] > 0
            assert x["poll_s"] > 0                      # at least the poll after the compute
            assert sorted(x["sent_to"]) == sorted(set(x["sent_to"])) and len(x["sent_to"]) == x["sent"]
    wait = {r: sum(x["wait_s"] for x in rs) for r, rs in recs.items()}
    assert wait[3] < min(wait[0], wait[1], wait[2])              # the 2x slower rank waits least
    blamed = {}
    for r in (0, 1, 2):
        for x in recs[r]:
            for j, s in x.get("waited_on", []):
                blamed[j] = blamed.get(j, 0.0) + s
    assert max(blamed, key=blamed.get) == 3                      # ... and the others wait on it
    # the report shows the polls as a part of their own, out of "other"
    from hopdec.report.data import Run
    parts = Run.load(job["hop"]).breakdown()
    for r, rs in recs.items():
        assert parts[r]["poll"] == pytest.approx(sum(x["poll_s"] for x in rs))


def _trace(path):
    obj = json.load(open(path))
    assert set(obj) >= {"traceEvents", "displayTimeUnit"}
    ev = obj["traceEvents"]
    for e in ev:                                                 # the Trace Event format's fields
        assert e["ph"] in {"X", "i", "C", "M", "s", "f"}
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str)
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] > 0
        if e["ph"] == "i":
            assert e["s"] in ("t", "p", "g")
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
    return ev


def test_trace_decentralized(job):
    ev = _trace(job["hop"] / "trace.json")
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert {f"rank {r}" for r in range(N)} <= names
    slices = [e for e in ev if e["ph"] == "X"]
    for r in range(N):
        mine = [e for e in slices if e["pid"] == r + 1]
        its = [e for e in mine if e["cat"] == "iteration"]
        assert len(its) == ITERS
        for e in mine:                                           # every part lies inside an iteration
            if e["cat"] != "iteration":
                assert any(i["ts"] <= e["ts"] and e["ts"] + e["dur"] <= i["ts"] + i["dur"] + 1 for i in its), e
        assert {"compute", "send", "reduce", "apply"} <= {e["cat"] for e in mine}
    waits = [e for e in slices if e["cat"] == "wait" and e["pid"] != 4]
    assert waits and sum("3" in e["name"] for e in waits) > len(waits) / 2     # waiting on the slow rank 3
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts and set(starts) == set(ends) and all(e["bp"] == "e" for e in ends.values())
    assert all(starts[i]["pid"] != ends[i]["pid"] for i in starts)    # an arrow goes from sender to receiver
    assert any(e["name"] == "consensus distance" for e in ev if e["ph"] == "C")


def test_trace_ps(job):
    ev = _trace(job["ps"] / "trace.json")
    server = [e for e in ev if e["pid"] == 1 and e["ph"] == "X"]
    assert server and all(e["name"].startswith("apply") for e in server)
    for r in (2, 3, 4):
        cats = {e["cat"] for e in ev if e["pid"] == r and e["ph"] == "X"}
        assert {"compute", "send"} <= cats


def test_tensorboard_scalars(job):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    for r in range(N):
        acc = EventAccumulator(str(job["hop"] / "tb" / f"rank{r}"))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"loss", "time/compute_s", "time/wait_s", "queue/tokens", "updates/used"} <= tags
        assert [s.step for s in acc.Scalars("loss")] == list(range(ITERS))
        if r == 0:
            assert [s.step for s in acc.Scalars("consensus/mean")] == list(range(EVERY, ITERS, EVERY)) + [ITERS]


def test_report_and_plot_of_real_and_ps_runs(job, tmp_path):
    out = tmp_path / "report.html"
    cmd = [sys.executable, "-m", "hopdec.cli", "report", str(job["hop"]), str(job["ps"]), "-o", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    page = out.read_text()
    assert page.count("data:image/png;base64,") >= 4
    assert not re.search(r'(src|href)="(https?:|file:|//)', page)            # self-contained
    for s in ("At a glance", "consensus distance", "where each worker", "PS --sync ssp", "Server decisions"):
        assert s in page, s
    assert "SIMULATED" not in page
    png = tmp_path / "gap.png"
    p = subprocess.run([sys.executable, "-m", "hopdec.cli", "plot", str(job["hop"]), str(job["ps"]), "--what",
                        "gap", "-o", str(png)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p.stderr
