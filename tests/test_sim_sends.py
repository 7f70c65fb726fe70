"""The simulator's send model (hopdec.sim.sends): when data moves and when a send completes, on closed-form
cases -- a rendezvous message waits for its receiver (and with push, its sender) to be out of compute,
the zero-copy path's Reduce waits for its sends once its pool of stores is full, eager messages and the
copying path never do."""

import io
import statistics

import pytest

from hopdec.cli.sim import parse
from hopdec.runtime.metrics import read_log
from hopdec.sim.run import simulate
from hopdec.sim.sends import SendPath


def run(tmp_path, *extra, n=2, iterations=40, topology="ring"):
    d = tmp_path / "_".join(a.strip("-").replace("=", "") for a in extra if a)[:60]
    argv = ["--topology", topology, "-n", str(n), "--iterations", str(iterations), "--log-dir", str(d), "--overwrite",
            "--invariants", "on"] + [a for a in extra if a]
    simulate(parse(argv), out=io.StringIO())
    logs = [read_log(d / f"rank{r}.jsonl") for r in range(n)]
    per_iter = statistics.median(
        (recs[-1]["time"] - recs[5]["time"]) / (recs[-1]["iter"] - recs[5]["iter"]) for recs in logs)
    sends = sum(x.get("wait_sends_s", 0.0) for recs in logs for x in recs)
    return per_iter, sends


def test_send_path_describes_itself():
    p = SendPath()
    assert p.protocol(65536) is None and p.protocol(65537) == "take" and p.waits(1e6)
    assert not SendPath("copy").waits(1e6) and SendPath("copy").protocol(1e6) == "take"
    assert "Reduce waits at the pool's cap" in p.describe(1e6) and "eager" in p.describe(100)
    with pytest.raises(ValueError):
        SendPath(rendezvous="pull")


def test_push_does_not_overlap_the_senders_compute(tmp_path):
    """Two workers, compute 0.1 s, 1 MiB messages over 80 Mbit/s NICs (0.105 s): with ``take`` the
    transfer overlaps the compute (an iteration ~ the longer of the two); with ``push`` the data moves only
    when the sender is out of its compute (compute + transfer); an eager message overlaps as take does."""
    net = ["--compute-time", "0.1", "--message-mb", "1", "--bandwidth", "0.08", "--latency", "0"]
    take, _ = run(tmp_path, *net)
    push, _ = run(tmp_path, *net, "--rendezvous", "push")
    eager, waited = run(tmp_path, *net, "--rendezvous", "push", "--eager-limit", "2000000")
    transfer = 2 ** 20 * 8 / 0.08e9
    assert take == pytest.approx(max(0.1, transfer), rel=0.02)
    assert push == pytest.approx(0.1 + transfer, rel=0.02)
    assert eager == pytest.approx(take, rel=0.02) and waited == 0


def test_zero_copy_reduce_waits_for_a_slow_receiver_only_with_its_pool_full(tmp_path, monkeypatch):
    """The audit's torus 2x4 with rank 2 four times slower, backup workers and skipping (the fast workers
    may leave the straggler behind). With the pool of send stores (up to max_ig + 2) its in-neighbours
    never wait for their sends: they run as on the copying path and with eager messages. With the pool
    held at two stores (what the runtime had before it) they wait in Reduce until the straggler took
    their updates, which it does once per compute (0.2 s): two iterations per compute of it (0.1 s each)."""
    base = ["--compute-time", "0.05", "--slowdown", "rank=2,factor=4", "--max-ig", "3", "--backup-workers",
            "1", "--skip", "max-jump=3,trigger=2", "--latency", "0", "--message-mb", "0.5"]
    zero, waited = run(tmp_path, *base, topology="torus", n=8, iterations=60)
    copy, copy_waited = run(tmp_path, *base, "--send-path", "copy", topology="torus", n=8, iterations=60)
    eager, eager_waited = run(tmp_path, *base, "--eager-limit", "1e7", topology="torus", n=8, iterations=60)
    assert waited == copy_waited == eager_waited == 0
    assert copy < 0.08 and zero == pytest.approx(copy, rel=0.02) and eager == pytest.approx(copy, rel=0.05)
    import hopdec.runtime.hop_loop as loop
    monkeypatch.setattr(loop, "store_cap", lambda core: 2)
    two, two_waited = run(tmp_path, *base, topology="torus", n=8, iterations=60)
    assert two_waited > 1.0 and two == pytest.approx(0.1, rel=0.02), (two, zero)


def test_grants_ride_with_their_update(tmp_path):
    """A grant due with an update travels in its header, as in the MPI transport: on a ring with
    tokens no grant needs a message of its own."""
    d = tmp_path / "g"
    argv = ["--topology", "ring", "-n", "4", "--iterations", "20", "--log-dir", str(d)]
    out = io.StringIO()
    simulate(parse(argv), out=out)
    assert "0 control messages" in out.getvalue()
