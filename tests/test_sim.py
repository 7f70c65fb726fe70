"""The virtual-time simulator (``hopdec sim``, :mod:`hopdec.sim`), in-process: the cost model, determinism,
the Hop invariants at every event, every mode of both fidelities, the options and the outputs."""

import io
import json
import math
import random

import numpy as np
import pytest

from hopdec import topology as T
from hopdec.cli.sim import main, parse
from hopdec.errors import ConfigError
from hopdec.hop.config import ProtocolConfig
from hopdec.hop.invariants import InvariantError, Invariants
from hopdec.hop.worker import node_views
from hopdec.ps.sync import SYNC_MODES, sync_policy
from hopdec.report.gaps import max_iteration_gap
from hopdec.runtime.metrics import read_log
from hopdec.sim.costs import ComputeModel, parse_dist
from hopdec.sim.events import EventQueue
from hopdec.sim.hop import HopSim
from hopdec.sim.network import LinkModel, Network
from hopdec.sim.ps import PSSim
from hopdec.report.gaps import largest_gap
from hopdec.sim.run import simulate
from reference import synchronous_averaging

MB = 1e6


def sim(argv):
    """Run ``hopdec sim ARGV`` in-process; returns (figures, printed text)."""
    out = io.StringIO()
    res = simulate(parse([str(a) for a in argv]), out=out)
    return res, out.getvalue()


def transfers(n, sends, model, hubs=()):
    """``sends = [(start, src, dsts, bytes)]`` -> {(src, dst, start): arrival time}."""
    q = EventQueue()
    net = Network(q, n, model, hubs=hubs)
    got = {}
    for start, src, dsts, nbytes in sends:
        q.at(start, lambda s=src, d=dsts, b=nbytes, t0=start: net.send(
            s, d, b, lambda dst, s=s, t0=t0: got.__setitem__((s, dst, t0), q.now)))
    q.run()
    return got


# ---------------------------------------------------------------------------------------------
# the network: NICs shared by concurrent transfers


def test_two_concurrent_sends_take_twice_as_long():
    one = transfers(3, [(0.0, 0, (1,), MB)], LinkModel(bandwidth=MB))
    two = transfers(3, [(0.0, 0, (1, 2), MB)], LinkModel(bandwidth=MB))
    assert one == {(0, 1, 0.0): pytest.approx(1.0)}
    assert two == {(0, 1, 0.0): pytest.approx(2.0), (0, 2, 0.0): pytest.approx(2.0)}


def test_concurrent_receives_share_the_receivers_nic():
    got = transfers(4, [(0.0, 1, (0,), MB), (0.0, 2, (0,), MB), (0.0, 3, (0,), MB)], LinkModel(bandwidth=MB))
    assert sorted(got.values()) == pytest.approx([3.0, 3.0, 3.0])


def test_workers_of_a_machine_share_its_nic_and_talk_through_shared_memory():
    """``hosts``: a machine's NIC (as fast as its slowest worker's) carries everything that leaves or enters
    it; inside it a message takes the latency only."""
    m = LinkModel(bandwidth=MB, latency=0.01, hosts={0: "a", 1: "a", 2: "b", 3: "b"})
    # two workers of machine a send to machine b at once: a's NIC is shared, 2 s each (alone: 1 s)
    got = transfers(4, [(0.0, 0, (2,), MB), (0.0, 1, (3,), MB)], m)
    assert got == {(0, 2, 0.0): pytest.approx(2.01), (1, 3, 0.0): pytest.approx(2.01)}
    assert transfers(4, [(0.0, 0, (1,), 100 * MB)], m) == {(0, 1, 0.0): pytest.approx(0.01)}
    # one send to a worker of its machine and one of another: only the second crosses the NICs
    assert transfers(4, [(0.0, 0, (1, 2), MB)], m) == {(0, 1, 0.0): pytest.approx(0.01),
                                                       (0, 2, 0.0): pytest.approx(1.01)}
    # a machine's NIC is its slowest worker's: worker 0 (1 MB/s) sends two messages through a's 0.25 MB/s
    slow = LinkModel(bandwidth=MB, latency=0.01, node_bandwidth={1: MB / 4}, hosts={0: "a", 1: "a"})
    assert transfers(4, [(0.0, 0, (2, 3), MB)], slow) == {(0, 2, 0.0): pytest.approx(8.01),
                                                          (0, 3, 0.0): pytest.approx(8.01)}


def test_a_later_transfer_slows_the_first_down_from_then_on():
    # alone for 0.5 s (half done), then shared: 0.5 MB more at 0.5 MB/s -> 1.5; the second has 0.5 MB
    # left at 1.5 and is alone again -> 2.0
    got = transfers(3, [(0.0, 0, (2,), MB), (0.5, 1, (2,), MB)], LinkModel(bandwidth=MB))
    assert got == {(0, 2, 0.0): pytest.approx(1.5), (1, 2, 0.5): pytest.approx(2.0)}


def test_full_duplex_sends_and_receives_at_once_half_duplex_shares():
    sends = [(0.0, 0, (1,), MB), (0.0, 1, (0,), MB)]
    assert sorted(transfers(2, sends, LinkModel(bandwidth=MB)).values()) == pytest.approx([1.0, 1.0])
    assert sorted(transfers(2, sends, LinkModel(bandwidth=MB, duplex="half")).values()) == pytest.approx([2.0, 2.0])


def test_latency_node_and_link_overrides():
    got = transfers(3, [(0.0, 0, (1, 2), MB)],
                    LinkModel(bandwidth=MB, latency=0.25, node_bandwidth={2: MB / 4},
                              links={(0, 1): (MB / 8, 0.5)}))
    # 0->1: its link carries 1/8 MB/s -> 8 s, + 0.5 s latency; 0->2: node 2's NIC 1/4 MB/s -> 4 s + 0.25
    assert got == {(0, 1, 0.0): pytest.approx(8.5), (0, 2, 0.0): pytest.approx(4.25)}


def test_messages_between_two_nodes_arrive_in_order():
    rng = random.Random(1)
    sends = sorted((rng.uniform(0, 3), 0, (1,), rng.choice([MB / 10, MB, 3 * MB])) for _ in range(40))
    sends += [(rng.uniform(0, 3), 2, (1,), MB) for _ in range(20)]        # competing traffic into node 1
    got = transfers(3, sends, LinkModel(bandwidth=MB, latency=0.01))
    mine = [got[(0, 1, s[0])] for s in sorted(sends) if s[1] == 0]
    assert mine == sorted(mine)


def test_a_periodic_call_skips_the_grid_times_with_no_event_between():
    """``hopdec sim --math --eval-interval 1e-9`` never ended: an evaluation every nanosecond of virtual time,
    ~10^9 per virtual second however few events. A grid time with no event since the last call is skipped
    (the model did not change), so the calls are at most one per event; an interval below the clock's
    resolution there (``now + interval == now``) moves on as well."""
    for interval in (1e-9, 1e-300):
        q, calls = EventQueue(), []

        def tick():
            calls.append(q.now)
            assert len(calls) <= 25, f"interval {interval}: a call per grid time, not per event"
        q.every(interval, tick)
        for k in range(1, 11):
            q.at(k * 0.5, lambda: None)
            q.at(k * 0.5, lambda: None)         # two at one instant: still one call after them
        q.run()
        assert 10 <= len(calls) <= 11 and calls == sorted(calls)
        assert all(a < b for a, b in zip(calls, calls[1:]))
    q, calls = EventQueue(), []                  # events between grid times: a call at each, as before
    q.every(0.25, lambda: calls.append(q.now))
    for k in range(1, 21):
        q.at(k * 0.1, lambda: None)
    q.run()
    assert calls == [0.25 * k for k in range(1, 8)]
    q, calls = EventQueue(), []                  # none between: straight to the grid time after the next
    q.every(0.25, lambda: calls.append(q.now))
    q.at(1.9, lambda: None)
    q.at(2.1, lambda: None)
    q.run()
    assert calls == [0.25, 2.0]


def test_an_evaluation_interval_far_below_an_iteration_ends(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "hopdec", "sim", "--mode", "allreduce", "-n", "2", "--iterations", "4",
                          "--model", "mlp", "--math", "--threads", "1", "--compute-time", "0.1",
                          "--eval-interval", "1e-9", "--log-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    evals = [json.loads(line) for line in open(tmp_path / "eval.jsonl")]
    assert 4 <= len(evals) <= 20 and evals[-1]["final"]


@pytest.mark.parametrize("argv, updates", [
    (["--sync", "esync", "-n", "2", "--iterations", "40"], "server: 39 updates"),
    (["--sync", "asp", "-n", "3", "--iterations", "100", "--compute-time", "5000"], "server: 300 updates")])
def test_a_server_nic_transfer_below_the_clocks_resolution_ends(argv, updates):
    """A hub transfer with a few bytes left above the completion tolerance, whose time left is below the
    float resolution of now (now + dt == now), was rescheduled at one virtual time forever (100% CPU)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "hopdec", "sim", "--no-progress", "--message-mb", "0.001",
                          "--bandwidth", "100", *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert updates in out.stdout


@pytest.mark.parametrize("seed", range(20))
def test_random_servers_with_tiny_messages_on_fast_nics_end(seed):
    """Seeded PS runs where a message's time on the server's NIC is near the float resolution of the virtual
    clock (1e-9..1e-3 MiB at 100 Gb/s..100 Tb/s): before the fix 37 of 40 such runs never ended. Each must
    end within 20 s (an alarm, in this process)."""
    import signal
    r = random.Random(seed)
    argv = ["--no-progress", "--sync", r.choice(["bsp", "asp", "ssp", "backup", "esync"]), "-n", r.randint(2, 8),
            "--iterations", r.randint(20, 120), "--message-mb", r.choice([1e-9, 1e-6, 1e-4, 1e-3]),
            "--bandwidth", r.choice([100, 400, 1e5]), "--compute-time", r.choice(["0.1", "5000", "normal:mean=0.25,std=0.02"])]

    def stuck(*_):
        raise AssertionError(f"hopdec sim {' '.join(map(str, argv))}: no end after 20 s")
    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(20)
    try:
        res, _ = sim(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert res["virtual_s"] > 0


@pytest.mark.parametrize("argv, says", [
    (["--sync", "ssp"], "the sync model's gap bound held at all"),
    (["--sync", "asp"], "--invariants on: --sync asp bounds no gap, so nothing was checked"),
    (["--sync", "esync"], "--invariants on: --sync esync bounds no gap, so nothing was checked"),
    (["--mode", "allreduce"], "--invariants on: the all-reduce has no protocol state to check (lockstep)")])
def test_invariants_on_says_what_was_checked_in_every_mode(argv, says):
    """``--invariants on`` with a sync model that has no gap bound (ASP, ESync, ...) or the all-reduce
    said nothing: the user asked for checks and could not tell whether any ran."""
    _, text = sim(["--no-progress", "--invariants", "on", "-n", "3", "--iterations", "6", *argv])
    assert says in text.splitlines()[-1], text


def test_training_options_in_a_timing_only_simulation_are_one_note(capsys):
    """``hopdec sim --lr 0.5`` (timing only) took the lr and changed nothing, without a word. One note names
    what changes nothing (not an error: one command line serves train and sim); --batch-size counts with
    --epochs (it sets the iterations), and --math trains with them all."""
    base = ["-n", 2, "--model", "mlp", "--no-progress"]
    sim(base + ["--iterations", 2, "--lr", 0.5, "--momentum", 0.5, "--batch-size", 8, "--outer-lr", 0.5,
                "--local-steps", 2])
    notes = [x for x in capsys.readouterr().err.splitlines() if "changes nothing" in x or "change nothing" in x]
    assert notes == ["hopdec sim: note: --lr, --momentum, --outer-lr, --batch-size change nothing here: timing "
                     "only, no model trains (--math trains one)"]
    sim(base + ["--epochs", 0.01, "--batch-size", 8, "--mode", "ps"])
    assert "nothing here" not in capsys.readouterr().err
    sim(base + ["--iterations", 2, "--lr", 0.5])
    assert "hopdec sim: note: --lr changes nothing here" in capsys.readouterr().err
    sim(base + ["--iterations", 2, "--lr", 0.5, "--math", "--threads", 1])
    assert "nothing here" not in capsys.readouterr().err
    # the list names options by their strings: each must still be one a settings group takes (a rename
    # would otherwise drop it from the note without a word)
    from hopdec.settings.run import TRAINING_OPTIONS
    every = {opt for name in ("work", "protocol") for opt in getattr(parse([]), name).options().values()}
    assert set(TRAINING_OPTIONS) | {"--batch-size"} <= every, set(TRAINING_OPTIONS) - every


def test_the_traffic_line_counts_the_iterations_run_as_a_real_run_does():
    """The traffic line divided the bytes by n x --iterations, so a straggler that jumped over half of its
    iterations (sending nothing in them) lowered the simulator's figure, while ``hopdec train``'s divides
    by the iterations each rank ran: per worker and iteration run, now in both."""
    res, text = sim(["-n", 8, "--topology", "ring", "--iterations", 60, "--backup-workers", 1, "--skip",
                     "max-jump=2,trigger=2", "--slowdown", "rank=0,factor=4", "--no-progress"])
    ran = [s.iterations for s in res["stats"].values()]
    assert ran[0] < 40 and sum(ran) < 8 * 60                # rank 0 jumped
    sent = sum(io.bytes_sent for io in res["sim"].ios)
    line = next(x for x in text.splitlines() if x.startswith("traffic: "))
    assert line.startswith(f"traffic: {sent / sum(ran):,.0f} bytes of updates per worker and iteration run"), line


LATER = """
import torch.nn as nn
class Later(nn.Module):
    def __init__(self):
        super().__init__()
        self.l, self.calls = nn.Linear(64, 10), 0
    def forward(self, x):
        self.calls += 1
        if self.calls > 6:
            raise ValueError("exploded at call %d" % self.calls)
        return self.l(x.reshape(len(x), -1))
"""


def test_a_users_model_failing_mid_simulation_is_one_line(tmp_path, capsys, monkeypatch):
    """A model that passed the first check (two samples) and raised at its 7th forward printed Python's
    whole traceback through the simulator's frames; hopdec train prints one line. Now hopdec sim does too,
    exit 1, and HOPDEC_DEBUG=1 adds the traceback."""
    (tmp_path / "later.py").write_text(LATER)
    argv = ["-n", "2", "--iterations", "10", "--math", "--model", f"{tmp_path / 'later.py'}:Later", "--no-progress"]
    monkeypatch.delenv("HOPDEC_DEBUG", raising=False)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["hopdec sim: error: ValueError: exploded at call 7 (HOPDEC_DEBUG=1 shows the "
                                "traceback)"], err
    monkeypatch.setenv("HOPDEC_DEBUG", "1")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1] == "hopdec sim: error: ValueError: exploded at call 7"


def test_control_messages_take_the_latency_only():
    q = EventQueue()
    net = Network(q, 3, LinkModel(bandwidth=1.0, latency=0.125))   # 1 byte/s: data would take forever
    got = []
    net.control(0, (1, 2), lambda d: got.append((d, q.now)))
    q.run()
    assert got == [(1, 0.125), (2, 0.125)]


@pytest.mark.parametrize("n", [4, 8, 16])
def test_bsp_server_is_bandwidth_bound(n):
    """BSP with n workers, negligible compute, 1 MB messages over 1 MB/s NICs: each step pushes n gradients
    through the server's receiving NIC (n s) and sends n weights through its sending NIC (n s)."""
    steps = 5
    s = PSSim(sync_policy("bsp", range(1, n + 1)), lambda w, i: 1e-6, budget=steps * n,
              network=LinkModel(bandwidth=MB), message_bytes=MB).run()
    assert s.policy.version == steps
    # the first weights, then per step n pushes in and (but after the last) n weights out
    assert s.end_time == pytest.approx(n + steps * n + (steps - 1) * n, rel=1e-3)
    releases = [r["time"] for r in s.logged("release")]
    assert np.diff(releases) == pytest.approx([2.0 * n] * (len(releases) - 1), rel=1e-3)


# ---------------------------------------------------------------------------------------------
# compute costs


def test_compute_time_syntax_and_per_worker_values():
    m = ComputeModel(["0.25", "2-3@uniform:low=1,high=2", "3@normal:mean=5,std=0"], workers=range(5), seed=4)
    assert m.duration(0, 9) == 0.25 and m.duration(4, 9) == 0.25
    assert 1.0 <= m.duration(2, 9) <= 2.0 and m.duration(3, 9) == 5.0
    assert m.duration(2, 9) == ComputeModel(["2@uniform:low=1,high=2"], workers=range(5), seed=4).duration(2, 9)
    assert m.duration(2, 9) != m.duration(2, 10)
    assert parse_dist("normal:mean=0.25,std=0.02").describe() == "normal(mean 0.25, std 0.02)"


def test_draws_depend_only_on_seed_worker_and_iteration():
    a = ComputeModel(["normal:mean=1,std=0.3"], workers=range(4), seed=7, slowdowns=["random:factor=6,prob=1/n"])
    b = ComputeModel(["normal:mean=1,std=0.3"], workers=range(4), seed=7, slowdowns=["random:factor=6,prob=1/n"])
    order = [(w, i) for w in range(4) for i in range(600)]
    first = {k: a.step(*k) for k in order}
    random.Random(0).shuffle(order)
    assert {k: b.step(*k) for k in order} == first
    assert any(f == 6.0 for _, f in first.values()) and any(f == 1.0 for _, f in first.values())
    c = ComputeModel(["normal:mean=1,std=0.3"], workers=range(4), seed=8)
    assert [c.base(0, i) for i in range(5)] != [a.base(0, i) for i in range(5)]


def test_slowdowns_are_the_real_emulators():
    from hopdec.heterogeneity import Emulator
    m = ComputeModel(["0.1"], workers=range(1, 9), seed=3, slowdowns=["random:factor=6,prob=1/n", "rank=2,factor=3"])
    for w in (1, 2, 5):
        e = Emulator(["random:factor=6,prob=1/n", "rank=2,factor=3"], w, range(1, 9), seed=3)
        assert [m.step(w, i) for i in range(50)] == [(0.1 * e.factor(i), e.factor(i)) for i in range(50)]


@pytest.mark.parametrize("spec, words", [
    ("abc", "expected seconds"), ("-1", ">= 0"), ("normal:mean=1", "missing std"),
    ("normal:mean=1,std=x", "not a number"), ("gamma:k=1", "unknown distribution"),
    ("uniform:low=2,high=1", "low 2 > high 1"), ("uniform:low=1,hi=2", "unknown key"),
    ("9@0.1", "rank 9 is not a worker"), ("a@0.1", "not a rank"), ("3-1@0.1", "empty range"),
    ("normal:mean=1,std=1,std=2", "given twice"), ("nan", ">= 0"),
    # (std 10 on mean 0.1 ran at a mean of 4.5 s under the label "mean 0.1": the draws below 0 were clipped)
    ("normal:mean=0.1,std=10", "std 10 is over mean/2.33: more than 1% of the draws would fall below 0"),
    ("normal:mean=0,std=0.01", "std 0.01 is over mean/2.33"),
])
def test_bad_compute_time_is_one_line_naming_the_option(spec, words):
    with pytest.raises(ConfigError) as info:
        ComputeModel([spec], workers=range(4))
    msg = str(info.value)
    assert msg.startswith("--compute-time") and words in msg and "\n" not in msg


@pytest.mark.parametrize("argv, words", [
    (["-n", "4", "--bandwidth", "0"], "--bandwidth"),
    (["-n", "4", "--bandwidth", "7@10"], "--bandwidth '7@10': no rank 7 in ring-based(4) [default] (ranks 0..3)"),
    # a PS server's NIC is rank 0's: "rank 5 is not a worker (the workers are ranks 0..4)" named the server a worker
    (["--mode", "ps", "-n", "4", "--bandwidth", "5@10"], "--bandwidth '5@10': no rank 5 in this run (ranks 0..4)"),
    (["-n", "4", "--latency", "-1"], "--latency"),
    (["-n", "4", "--message-mb", "-2"], "--message-mb"),
    (["--topology", "ring"], "-n"),
    (["--topology", "topologies/ring_8.json", "-n", "4"], "has 8 workers but -n is 4"),
    (["--mode", "ps"], "-n"),
    (["--mode", "ps", "-n", "4", "--sync", "ssp", "--staleness", "-1"], "--staleness"),
    (["-n", "4", "--backup-workers", "3"], "--backup-workers 3: node 0 has 3 in-neighbour(s)"),
    (["-n", "4", "--eval-interval", "1"], "--eval-interval needs --math"),
    (["-n", "4", "--save-models", "--log-dir", "x"], "--save-models needs --math"),
    (["-n", "4", "--slowdown", "rank=9,factor=2"], "rank 9 is not a worker"),
    (["-n", "4", "--no-such-option"], "unrecognized arguments"),
    (["-n", "4", "--mode", "decentralized", "--sync", "bsp"], "parameter-server option"),
    (["-n", "4", "--lr", "nan"], "--lr nan"),
])
def test_bad_options_fail_with_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hopdec sim: error:") and words in err and "\n" not in err


# ---------------------------------------------------------------------------------------------
# the Hop cores in virtual time: invariants at every event, every protocol and mechanism

HOP_SETTINGS = {
    "tokens": dict(),
    "queue-only": dict(protocol="queue-only"),
    "notify-ack": dict(protocol="notify-ack"),
    "serial": dict(compute_graph="serial"),
    "backup": dict(backup_workers=1),
    "staleness": dict(staleness=2),
    "hybrid": dict(backup_workers=1, staleness=2),
    "skip": dict(backup_workers=1, skip_max_jump=3, max_ig=4),
}


def run_hop(graph, cfg, compute, network=LinkModel(bandwidth=MB, latency=0.01), message=0.05 * MB, check=True):
    views = node_views(graph)
    inv = Invariants(graph, cfg)
    logs = {v.rank: [] for v in views}
    calls = []

    def check_all(s):
        calls.append(1)
        inv.check(s.cores, s.in_flight, s.sent_to)
    s = HopSim(views, cfg, compute, network=network, message_bytes=message,
               check=check_all if check else None, on_record=lambda r, rec: logs[r].append(rec)).run()
    return s, inv, logs, len(calls)


@pytest.mark.parametrize("name", list(HOP_SETTINGS))
def test_invariants_hold_at_every_event(name):
    graph = T.ring_based(8)
    cfg = ProtocolConfig(iterations=60, **HOP_SETTINGS[name])
    cm = ComputeModel(["normal:mean=0.05,std=0.01"], range(8), seed=2,
                      slowdowns=["random:factor=6,prob=1/n"] + (["rank=0,factor=4"] if name == "skip" else []))
    s, inv, logs, calls = run_hop(graph, cfg, cm.step)
    assert calls == s.q.events == inv.checks > 500             # after every single event
    assert all(s.done) and [c.iteration for c in s.cores] == [59] * 8 or name == "skip"
    assert all(logs[r][-1]["iter"] == 59 for r in logs)
    gap = int(max_iteration_gap([[(x["time"], x["iter"]) for x in logs[r]] for r in sorted(logs)]).max())
    assert s.max_gap == gap <= inv.bounds.max()
    if name == "skip":
        assert any("jumped_from" in x for x in logs[0])        # the straggler did skip


def test_the_invariant_check_does_catch_a_broken_bound():
    """The checker is wired in: run max_ig 3 but check against max_ig 1's bounds -> it must fire (with
    backup workers the gap bound is max_ig x path length, and a slow worker makes the others use it)."""
    graph = T.ring_based(8)
    cm = ComputeModel(["0.05", "0@0.3"], range(8))
    views = node_views(graph)
    strict = Invariants(graph, ProtocolConfig(iterations=30, max_ig=1, backup_workers=1))
    s = HopSim(views, ProtocolConfig(iterations=30, max_ig=3, backup_workers=1), cm.step, network=LinkModel(),
               check=lambda s: strict.check(s.cores))
    with pytest.raises(InvariantError, match="exceeds Table 1's bound"):
        s.run()


def test_constant_compute_free_network_runs_at_one_over_compute():
    graph = T.ring(6)
    s, _, logs, _ = run_hop(graph, ProtocolConfig(iterations=40), lambda w, i: 0.2, network=LinkModel(),
                            message=MB)
    assert s.now == pytest.approx(40 * 0.2)
    assert all(x["time"] == pytest.approx(0.2 * x["iter"]) for r in logs for x in logs[r])
    assert all(x["wait_s"] == 0 for r in logs for x in logs[r])


def test_a_slow_link_is_what_everyone_waits_for():
    """One link with 1/100 of the bandwidth: its receiver waits for it, and tokens pass that on."""
    graph = T.ring(6)
    fast = LinkModel(bandwidth=100 * MB)
    slow = LinkModel(bandwidth=100 * MB, links={(0, 1): (MB, None)})
    a, _, _, _ = run_hop(graph, ProtocolConfig(iterations=30), lambda w, i: 0.1, network=fast, message=MB)
    b, _, logs, _ = run_hop(graph, ProtocolConfig(iterations=30), lambda w, i: 0.1, network=slow, message=MB)
    assert a.now == pytest.approx(30 * 0.1 + 3 * 0.01, rel=0.01)    # 10 ms transfers overlap compute
    assert b.now > 25                                                # ~1 s per iteration
    assert sum(x["wait_s"] for x in logs[1]) > 20


def test_gap_tracking_equals_the_replay_of_the_logs():
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(2, 6)
        entries = []
        for r in range(n):
            t, k, ev = 0.0, 0, []
            for _ in range(rng.randint(1, 8)):
                ev.append((t, k))
                t += rng.choice([0.0, 0.5, 1.0, rng.random()])
                k += rng.choice([1, 1, 2])
            entries.append(ev)
        assert largest_gap(entries) == int(max_iteration_gap(entries).max())


# ---------------------------------------------------------------------------------------------
# hopdec sim: every mode, both fidelities, labelled outputs, determinism

SLOW = ["--compute-time", "normal:mean=0.05,std=0.005", "--slowdown", "random:factor=6,prob=1/n"]


@pytest.mark.parametrize("extra", [[], ["--protocol", "queue-only"], ["--protocol", "notify-ack"],
                                   ["--compute-graph", "serial"], ["--backup-workers", "1"],
                                   ["--staleness", "3", "--stale-reduce", "plain"],
                                   ["--backup-workers", "1", "--staleness", "2"],
                                   ["--backup-workers", "1", "--skip", "max-jump=2,trigger=2"]])
def test_every_decentralized_setting_runs_with_its_summary(extra):
    res, text = sim(["-n", "8", "--iterations", "40"] + SLOW + extra)
    assert text.startswith("== SIMULATED (timing only): decentralized ")
    assert "times: SIMULATED (timing only) -- virtual seconds" in text
    assert "largest iteration gap observed:" in text and "held at all" in text
    assert res["max_gap"] <= res["bound"] and res["checks"] == res["events"]
    assert all(s.iterations >= 20 for s in res["stats"].values())


@pytest.mark.parametrize("sync, extra, unfinished, discarded", [
    ("asp", ["--seed", "0"], 0, 3),
    ("backup", ["--seed", "0"], 0, 3),
    ("backup", ["--seed", "3"], 1, 2),                  # the budget met while the next step collected
    ("backup", ["--seed", "6", "--slowdown", "rank=3,factor=2"], 2, 1),
])
def test_ps_summary_accounts_for_every_mini_batch_computed(sync, extra, unfinished, discarded, tmp_path):
    # --iterations is a work budget that counts dropped gradients (backup), so it can be met while the next
    # step collects pushes: those wait in a step the stop leaves unfinished; and workers computing when it
    # was met push after the stop, not used. The server's line counts both, so the table's "iters run" add
    # up to applied + dropped + those, and the pending ones' records do not claim their gradient was applied.
    res, text = sim(["--sync", sync, "-n", "4", "--iterations", "20", "--log-dir", tmp_path,
                     "--compute-time", "normal:mean=0.1,std=0.03"] + extra)
    server = res["sim"].server
    assert (server.unfinished, server.discarded) == (unfinished, discarded)
    ran = sum(s.iterations for s in res["stats"].values())
    per_update = 3 if sync == "backup" else 1
    assert ran == server.applied * per_update + server.dropped + server.unfinished + server.discarded
    assert server.work == ran - server.discarded >= 20 * 4   # the budget: all but what came after the stop
    said = f"server: {server.applied} updates, {server.dropped} gradients dropped, " + (
        f"{unfinished} pushed into a step the stop left unfinished, " if unfinished else "") + \
        f"{discarded} computed after the stop (not used), "
    assert said in text
    last = {w: read_log(tmp_path / f"rank{w}.jsonl")[-1] for w in range(1, 5)}
    assert sum(r["staleness"] is None for r in last.values()) == unfinished
    from hopdec.report.data import Run
    from hopdec.report.html import render
    assert said.split(": ", 1)[1].rsplit(", ", 1)[0][len(f"{server.applied} updates"):] + "</li>" in \
        render([Run.load(str(tmp_path))])               # the report says so too


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_every_sync_mode_runs_through_the_server_nic(sync):
    # --sync implies --mode ps
    res, text = sim(["--sync", sync, "-n", "6", "--iterations", "30", "--message-mb", "4",
                     "--compute-time", "0.05", "--slowdown", "rank=2,factor=3"])
    assert text.startswith(f"== SIMULATED (timing only): parameter server --sync {sync}")
    assert "server:" in text and "messages of 4 MiB" in text
    s = res["sim"]
    assert all(s.done.values()) and s.server.work >= 30 * 6
    assert s.net.bytes >= 4 * 2 ** 20 * 30 * 6                   # every push went through the network
    if res["bound"] is not None:
        assert res["max_gap"] <= res["bound"]


def test_same_seed_same_logs_other_seed_other_logs(tmp_path):
    argv = ["--topology", "ring-based", "-n", "8", "--iterations", "50", "--backup-workers", "1"] + SLOW
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        sim(argv + ["--seed", seed, "--log-dir", tmp_path / name])
    for r in range(8):
        a, b, c = ((tmp_path / x / f"rank{r}.jsonl").read_text() for x in "abc")
        assert a == b
        assert a != c
    ps = ["--mode", "ps", "--sync", "dssp", "-n", "5", "--iterations", "40"] + SLOW
    for name in ("p", "q"):
        sim(ps + ["--seed", "3", "--log-dir", tmp_path / name])
    for r in range(6):
        assert (tmp_path / "p" / f"rank{r}.jsonl").read_text() == (tmp_path / "q" / f"rank{r}.jsonl").read_text()


def test_math_is_deterministic_too(tmp_path):
    argv = ["-n", "4", "--math", "--model", "mlp", "--iterations", "20", "--backup-workers", "1", "--seed", "5"] + SLOW
    texts = []
    for name in ("a", "b"):
        texts.append(sim(argv + ["--log-dir", tmp_path / name])[1])
    assert texts[0].split("simulated ")[0] == texts[1].split("simulated ")[0]    # all but the wall time
    for r in range(4):
        assert (tmp_path / "a" / f"rank{r}.jsonl").read_text() == (tmp_path / "b" / f"rank{r}.jsonl").read_text()


def test_logs_are_a_real_runs_with_virtual_times(tmp_path):
    res, text = sim(["--topology", "topologies/ring_based_8.json", "--iterations", "30", "--message-mb", "528",
                     "--bandwidth", "10", "--log-dir", tmp_path] + SLOW)
    header = json.loads((tmp_path / "rank3.jsonl").read_text().splitlines()[0])["run"]
    assert header["simulated"] == "SIMULATED (timing only)" and header["device"] == "simulated"
    assert header["cost_model"]["message_mb"] == 528 and header["cost_model"]["network"]["bandwidth_gbps"] == 10
    recs = read_log(tmp_path / "rank3.jsonl")
    assert [r["iter"] for r in recs] == list(range(30))
    assert {"rank", "iter", "time", "loss", "compute_s", "wait_s", "tokens", "reduced", "slowdown"} <= set(recs[0])
    assert recs[0]["time"] == 0.0 and recs[-1]["time"] < res["virtual_s"]
    # 528 MB to 3 neighbours over 10 Gb/s: ~1.3 s per iteration, far more than the compute
    assert res["virtual_s"] / 30 > 1.2 and "messages of 528 MiB" in text


def test_message_size_defaults_to_the_models_real_size():
    res, text = sim(["-n", "4", "--iterations", "5", "--model", "mlp"])
    assert "messages of 0.03666 MiB (mlp: 9610 parameters x 4 bytes)" in text


def test_math_trains_and_equals_synchronous_averaging_on_a_complete_graph(tmp_path):
    import torch

    from hopdec.ml.data import load_dataset, partition
    from hopdec.ml.models import PRESETS
    from hopdec.ml.trainer import LocalTrainer
    n, iters, seed = 4, 12, 3
    res, text = sim(["--topology", "topologies/complete_4.json", "--math", "--iterations", iters, "--seed", seed,
                     "--log-dir", tmp_path, "--save-models", "--compute-time", "0.1", "--slowdown", "rank=1,factor=2"])
    assert text.startswith("== SIMULATED (--math): decentralized") and "averaged model: test loss" in text
    assert "times: SIMULATED (--math)" in text
    torch.set_num_threads(1)
    ds = load_dataset("digits", seed=seed)
    h = PRESETS["cnn"]
    ref = [LocalTrainer("cnn", ds, partition(ds.train_y, n, r, "iid", seed), lr=h["lr"], momentum=h["momentum"],
                        weight_decay=h["weight_decay"], batch_size=h["batch_size"], seed=seed,
                        data_seed=seed * 7919 + r) for r in range(n)]
    synchronous_averaging(ref, iters)
    for r in range(n):
        np.testing.assert_allclose(np.load(tmp_path / f"params_rank{r}.npy"), ref[r].flat.detach().numpy(),
                                   atol=1e-6, rtol=0)
    # virtual time: rank 1 is 2x slower, so everyone runs at its pace
    assert res["virtual_s"] == pytest.approx(iters * 0.2, rel=0.01)


def test_math_accuracy_over_virtual_time(tmp_path):
    res, text = sim(["--topology", "topologies/ring_based_8.json", "--math", "--model", "mlp", "--iterations", "150",
                     "--compute-time", "0.05", "--eval-interval", "1", "--log-dir", tmp_path])
    evals = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [e["time"] for e in evals[:4]] == [0.0, 1.0, 2.0, 3.0]
    assert evals[0]["test_acc"] < 0.3 and evals[-1]["test_acc"] > 0.8 and evals[-1]["final"]
    assert {e["simulated"] for e in evals} == {"SIMULATED (--math)"}
    assert res["avg_acc"] == evals[-1]["test_acc"]


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_math_parameter_server(sync, tmp_path):
    res, text = sim(["--mode", "ps", "--sync", sync, "-n", "4", "--math", "--model", "mlp", "--iterations", "60",
                     "--compute-time", "0.05", "--slowdown", "rank=2,factor=2", "--eval-interval", "0.5",
                     "--log-dir", tmp_path])
    assert text.startswith(f"== SIMULATED (--math): parameter server --sync {sync}")
    ev = [json.loads(x) for x in (tmp_path / "rank0.jsonl").read_text().splitlines()[1:]]
    evals = [e for e in ev if e["event"] == "eval"]
    assert evals[0]["test_acc"] < 0.3 < 0.7 < evals[-1]["test_acc"]
    assert [e for e in ev if e["event"] == "summary"][0]["elapsed"] == pytest.approx(res["virtual_s"])


def test_large_runs_condense_the_table():
    res, text = sim(["--mode", "ps", "--sync", "asp", "-n", "100", "--iterations", "5"])
    assert "(100 workers: their mean, the slowest and the fastest; --log-dir keeps" in text
    assert text.count("\n") < 20


def test_topology_attributes_override_nics_and_links(tmp_path):
    """A node-link file whose edge 0->1 has its own bandwidth and latency, and node 2 a slower NIC."""
    import networkx as nx
    g = T.ring(4)
    data = nx.node_link_data(g, edges="edges")
    for e in data["edges"]:
        if (e["source"], e["target"]) == (0, 1):
            e.update(bandwidth=0.08, latency=0.5)           # 10 MB/s: a 1 MiB message takes ~0.1 s
    for node in data["nodes"]:
        if node["id"] == 2:
            node["bandwidth"] = 0.8
    path = tmp_path / "ring4.json"
    path.write_text(json.dumps(data))
    res, text = sim(["--topology", path, "--iterations", "10", "--compute-time", "0.01", "--message-mb", "1",
                     "--log-dir", tmp_path / "logs"])
    net = res["sim"].net.model
    assert net.links == {(0, 1): (1e7, 0.5)} and net.node_bandwidth == {2: 1e8}
    assert "1 link(s) with their own bandwidth or latency" in text
    # each update 0->1 takes 0.1 s on the link + 0.5 s latency: with max_ig 2 in flight, ~0.3 s per
    # iteration for everyone (without the attributes: ~0.01 s)
    assert res["virtual_s"] == pytest.approx(10 * 0.3, rel=0.1)
    bad = json.loads(path.read_text())
    bad["edges"][0]["bandwidth"] = "fast"
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="bandwidth: 'fast' is not a number"):
        sim(["--topology", path, "--iterations", "3"])


def reference_network(n, sends, model):
    """A direct, slow implementation of the same cost model (for checking the fast one): at every moment
    each pair's oldest message in transit moves at min over its NICs/link of capacity / transfers there;
    it arrives ``latency`` after its last byte; the next pair message starts when the previous ends."""
    down = n if model.duplex == "full" else 0
    cap = {}
    for i in range(n):
        c = model.node_bandwidth.get(i, model.bandwidth)
        cap[("out", i)] = c
        cap[("in", i) if down else ("out", i)] = c
    todo = sorted((t, k, s, d, b) for k, (t, s, dsts, b) in enumerate(sends) for d in dsts)
    queues, done, now = {}, {}, 0.0

    machines = model.machines()                 # machines of several nodes: one NIC each, shared memory inside
    host = {v: m for m, vs in machines.items() for v in vs}
    for m, vs in machines.items():
        cap[("mout", m)] = cap[("min", m) if down else ("mout", m)] = min(cap[("out", v)] for v in vs)

    def res(s, d):
        if s in host and host[s] == host.get(d):
            return []
        r = [("out", s), ("in", d) if down else ("out", d)]
        bw, _ = model.links.get((s, d), (None, None))
        r += [("link", s, d)] if bw is not None else []
        r += [("mout", host[s])] if s in host else []
        return r + ([("min", host[d]) if down else ("mout", host[d])] if d in host else [])

    def latency(s, d):
        lat = model.links.get((s, d), (None, None))[1]
        return model.latency if lat is None else lat

    for (s, d), (bw, _) in model.links.items():
        if bw is not None:
            cap[("link", s, d)] = bw
    while todo or any(queues.values()):
        for key, q in queues.items():           # no resources (one machine): arrives after the latency
            while q and not res(*key):
                h = q.pop(0)
                done[(h["s"], h["d"], h["t0"])] = h["t0"] + latency(h["s"], h["d"])
        heads = [q[0] for q in queues.values() if q]
        count = {}
        for h in heads:
            for r in res(h["s"], h["d"]):
                count[r] = count.get(r, 0) + 1
        rates = [min(cap[r] / count[r] for r in res(h["s"], h["d"])) for h in heads]
        t_end = min([now + h["left"] / r for h, r in zip(heads, rates)], default=math.inf)
        t_next = todo[0][0] if todo else math.inf
        t = min(t_end, t_next)
        for h, r in zip(heads, rates):
            h["left"] -= r * (t - now)
        now = t
        for h in heads:
            if h["left"] <= 1e-9 * h["size"]:
                queues[(h["s"], h["d"])].pop(0)
                done[(h["s"], h["d"], h["t0"])] = now + latency(h["s"], h["d"])
        while todo and todo[0][0] <= now:
            t0, _, s, d, b = todo.pop(0)
            queues.setdefault((s, d), []).append(dict(s=s, d=d, t0=t0, left=b, size=b))
    return done


@pytest.mark.parametrize("seed", range(100))
def test_fast_network_equals_the_direct_model(seed):
    """Random traffic (fan-out sends, repeated pairs, per-node and per-link overrides, both duplex modes;
    half the seeds with node 0 a hub that mostly talks to everyone, as a parameter server; half with
    machines whose nodes share a NIC): the event-driven Network gives the same arrival times as the
    direct implementation above."""
    rng = random.Random(seed)
    hub = seed % 2 == 1
    n = rng.randint(2, 6)
    links = {}
    for _ in range(rng.randint(0, 3)):
        s, d = rng.sample(range(n), 2)
        links[(s, d)] = (rng.choice([None, MB / 3]), rng.choice([None, 0.0, 0.2]))
    hosts = {}
    if seed % 4 >= 2 and n >= 3:                 # half the seeds: machines of several nodes sharing a NIC
        hosts = {v: rng.choice("ab") for v in range(n) if rng.random() < 0.8}
    model = LinkModel(bandwidth=MB, latency=rng.choice([0.0, 0.05, 0.3]), duplex=rng.choice(["full", "half"]),
                      node_bandwidth={rng.randrange(n): MB / 2} if rng.random() < 0.5 else {}, links=links,
                      hosts=hosts)
    sends = []
    for _ in range(rng.randint(1, 25)):
        s = rng.randrange(n)
        dsts = tuple(rng.sample([d for d in range(n) if d != s], rng.randint(1, n - 1)))
        if hub and rng.random() < 0.8:                       # pushes to the hub, or its broadcasts
            s, dsts = (0, tuple(range(1, n))) if rng.random() < 0.3 else (rng.randrange(1, n), (0,))
        t0 = rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 4)])
        sends.append((t0, s, dsts, rng.choice([MB / 4, MB, 2 * MB])))
    sends = list({(t, s): (t, s, d, b) for t, s, d, b in sends}.values())   # one send per (time, sender)
    want = reference_network(n, sends, model)
    got = transfers(n, sends, model, hubs=(0,) if hub else ())
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-9), (k, got[k], want[k])
