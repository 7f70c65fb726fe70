"""Worker deaths in the simulator (``hopdec sim --fault-tolerance --deaths / --death-trace / --churn-mttf``,
:mod:`hopdec.sim.churn`; issue 21 item 3): the survivors heal through the heal code of a real
``--fault-tolerance`` run, in virtual time, with the Hop invariants checked at every event; hostile trace
files are one line; and the same death gives the same survivors and healed graph as a real ULFM run."""

import io
import json
import os
import re

import networkx as nx
import pytest

from hopdec import topology as T
from hopdec.cli.main import main as cli_main
from hopdec.cli.sim import main, parse
from hopdec.hop.config import ProtocolConfig
from hopdec.hop.invariants import Invariants
from hopdec.hop.worker import node_views
from hopdec.sim.churn import MAX_TRACE_BYTES, Churn, churn_deaths
from hopdec.sim.costs import ComputeModel
from hopdec.sim.hop import HopSim
from hopdec.sim.network import LinkModel
from hopdec.sim.run import simulate
from hopdec.topology.heal import heal_graph

EXP8 = "topologies/exponential_8.json"
BASE = ["--topology", EXP8, "--iterations", 60, "--compute-time", 0.05, "--fault-tolerance"]


def sim(argv):
    out = io.StringIO()
    res = simulate(parse([str(a) for a in argv]), out=out)
    return res, out.getvalue()


def log_lines(log_dir, rank):
    with open(os.path.join(log_dir, f"rank{rank}.jsonl")) as f:
        lines = [json.loads(x) for x in f]
    return lines[0]["run"], [x for x in lines[1:] if "iter" in x], [x for x in lines[1:] if x.get("event")]


# ---- deaths at given times ------------------------------------------------------------------------
def test_two_deaths_the_survivors_heal_twice_and_finish_every_iteration(tmp_path):
    """Workers 3 and 6 of 8 die at virtual 1.0 s and 2.0 s: the six survivors heal twice (the graph is
    heal_graph's, each survivor's view its node view), log every iteration once, the invariants hold at
    every event, the dead stop logging at their death, and the run takes longer than without deaths."""
    res, out = sim(BASE + ["--deaths", "3@1.0", "--deaths", "6@2.0", "--log-dir", tmp_path])
    base, _ = sim(BASE)
    churn = res["churn"]
    assert sorted(churn.alive) == [0, 1, 2, 4, 5, 7] and [w for _, w, _ in churn.died] == [3, 6]
    assert [h["failed"] for h in churn.heals] == [[3], [6]]
    assert res["checks"] == res["events"] > 500                       # every event, on the survivors
    expected = heal_graph(heal_graph(T.load(EXP8), [3])[0], [6])[0]
    assert sorted(churn.graph.edges) == sorted(expected.edges)
    views = {v.rank: v for v in node_views(expected)}
    for r in churn.alive:
        header, recs, events = log_lines(tmp_path, r)
        assert [x["iter"] for x in recs] == list(range(60)), f"rank {r}"
        heals = [e for e in events if e["event"] == "heal"]
        assert [h["failed"] for h in heals] == [[3], [6]] and heals[0]["simulated"].startswith("SIMULATED")
        assert heals[1]["in_neighbors"] == list(views[r].in_neighbors)
        assert heals[1]["out_neighbors"] == list(views[r].out_neighbors)
        assert header["simulated_deaths"]["first_deaths"] == [[1.0, 3], [2.0, 6]]
    assert cli_main(["report", str(tmp_path), "-o", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "Simulated deaths (2 heal(s)" in page and "rank(s) 6 died; 6 survivors healed" in page
    for w, t in ((3, 1.0), (6, 2.0)):
        _, recs, _ = log_lines(tmp_path, w)
        assert recs and recs[-1]["time"] <= t < 60 * 0.05
    assert res["virtual_s"] > base["virtual_s"] + 2 * 0.07            # nobody computes during a recovery
    assert "deaths (SIMULATED (timing only)): 2 worker(s) died, 2 heal(s)" in out
    assert re.search(r"failure: rank\(s\) 3 died near iteration \d+; 7 survivors healed the graph in "
                     r"[\d.]+ virtual s", out)
    rows = [ln.split() for ln in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s", ln)]
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 4, 5, 7]      # the survivors' table, as a real run


def test_a_huge_heal_stall_is_printed_in_a_few_digits():
    """``--heal-stall 1e308`` is a valid (absurd) duration: the failure line printed all 309 digits of it
    (a fixed-point format); now it reads ``1e+308``."""
    res, out = sim(BASE + ["--deaths", "3@1.0", "--heal-stall", "1e308"])
    line = next(ln for ln in out.splitlines() if "healed the graph in" in ln)
    assert "healed the graph in 1e+308 virtual s" in line and len(line) < 160, line


@pytest.mark.parametrize("detect", [0.06, 1.0])
def test_two_deaths_at_one_instant_are_one_recovery(detect):
    """Two workers die at the same virtual second (a host going down), found after ``detect`` s. Found after
    1 s, when every survivor was waiting for them, the first detection healed both at once and the second
    started a recovery with nobody to heal: ``ValueError: min() arg is an empty sequence`` ended the run.
    Now one heal takes both, the invariants hold at every event, and the survivors finish every iteration."""
    res, out = sim(BASE + ["--deaths", "3@1.0,6@1.0", "--failure-detection", detect])
    churn = res["churn"]
    assert [h["failed"] for h in churn.heals] == [[3, 6]] and sorted(churn.alive) == [0, 1, 2, 4, 5, 7]
    assert res["checks"] == res["events"]
    assert all(c.iteration == 59 for r, c in churn.alive.items()), out
    assert "2 worker(s) died, 1 heal(s)" in out


def test_detection_and_stall_are_what_the_survivors_wait():
    """One death, every other worker waiting for it soon: the run ends later by about the detection delay
    plus the stall (plus the compute a worker in the middle of one finishes before it joins)."""
    runs = {}
    for detect, stall in ((0.0, 0.0), (1.0, 0.0), (1.0, 2.0)):
        res, _ = sim(BASE + ["--deaths", "5@0.52", "--failure-detection", detect, "--heal-stall", stall])
        runs[(detect, stall)] = res["virtual_s"]
    assert 0.9 < runs[(1.0, 0.0)] - runs[(0.0, 0.0)] <= 1.0 + 1e-9
    assert abs(runs[(1.0, 2.0)] - runs[(1.0, 0.0)] - 2.0) < 1e-9


def test_a_death_that_disconnects_the_graph_is_bypassed(tmp_path):
    """On a one-way ring every worker is a cut vertex: without the bypass 1 -> 3 nobody would reach 3 again."""
    ring = tmp_path / "one_way_ring.txt"
    ring.write_text("".join(f"{i} {(i + 1) % 6}\n" for i in range(6)))
    g = T.load(str(ring))
    assert not nx.is_strongly_connected(g.subgraph(set(g) - {2}))
    res, out = sim(["--topology", ring, "--iterations", 40, "--compute-time", 0.05, "--fault-tolerance",
                    "--deaths", "2@0.5"])
    c = res["churn"]
    assert sorted(c.alive) == [0, 1, 3, 4, 5] and c.graph.has_edge(1, 3) and nx.is_strongly_connected(c.graph)
    assert all(c.sim.cores[r].iteration == 39 and c.sim.done[r] for r in c.alive)
    assert res["checks"] > 100


def test_deaths_after_the_end_change_nothing():
    base, _ = sim(BASE)
    res, out = sim(BASE + ["--deaths", "3@1000"])
    assert res["virtual_s"] == base["virtual_s"] and not res["churn"].died       # the run did not wait for it
    assert "0 worker(s) died" in out


@pytest.mark.parametrize("mode", [[], ["--mode", "ps", "-n", 4]])
def test_the_summary_counts_the_planned_deaths_the_run_ended_before(mode, tmp_path):
    """A death planned after the run's end never happens; the summary said only "1 worker(s) died" of three
    planned, so a trace whose times were in the wrong unit (milliseconds) read as a run nobody died in."""
    base = mode + BASE[2:] if mode else BASE                # (PS: no topology)
    res, out = sim(base + ["--deaths", "3@1000,4@0.5,2@2000"])
    line = next(x for x in out.splitlines() if x.startswith("deaths ("))
    assert "1 worker(s) died" in line
    assert line.endswith(f"; 2 planned death(s) came after the run had ended at virtual second {res['virtual_s']:.6g}")
    _, out = sim(base + ["--deaths", "4@0.5"])
    assert "came after the run" not in out


def test_math_averages_the_survivors_models():
    """--math: the dead worker's replica leaves the average; the survivors train on and report accuracies."""
    res, out = sim(["--topology", "ring-based", "-n", 6, "--math", "--model", "mlp", "--iterations", 60,
                    "--fault-tolerance", "--deaths", "0@0.5", "--eval-interval", 2])
    assert sorted(res["churn"].alive) == [1, 2, 3, 4, 5] and res["avg_acc"] > 0.7
    assert len(res["evals"]) >= 3 and "averaged model: test loss" in out
    rows = [ln.split() for ln in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s", ln)]
    assert sorted(int(r[0]) for r in rows) == [1, 2, 3, 4, 5] and all(float(r[-1]) > 0.5 for r in rows)


def test_math_evaluations_count_the_living_workers_iterations():
    """The eval records' iter_min/iter_mean counted the dead worker where it died: iter_min stayed at its
    last iteration for the rest of the run, and the mean was dragged down by it."""
    res, _ = sim(["--topology", "ring-based", "-n", 6, "--math", "--model", "mlp", "--iterations", 60,
                  "--compute-time", 0.05, "--fault-tolerance", "--deaths", "0@0.5", "--eval-interval", 1])
    c = res["churn"]
    died_at = c.died[0][2]
    late = [e for e in res["evals"] if e["time"] > 1.5 and not e.get("final")]
    assert late and died_at < 15
    for e in late:                                  # the survivors are far past the dead worker's iteration
        assert e["iter_min"] > died_at + 5 and e["iter_mean"] >= e["iter_min"], e


# ---- deaths from a trace file ---------------------------------------------------------------------
def test_a_trace_file_gives_the_same_run_as_the_same_deaths_on_the_command_line(tmp_path):
    trace = tmp_path / "deaths.trace"
    trace.write_text("\ufeff# seconds worker\n\n2.0, 6   # a comma is fine\n1.0\t3\n3.5 6\n")   # 6 twice: once
    a, out_a = sim(BASE + ["--death-trace", trace])
    b, out_b = sim(BASE + ["--deaths", "6@2.0,3@1.0"])
    assert [h["failed"] for h in a["churn"].heals] == [[3], [6]]
    assert out_a.split("\nsimulated ")[0] == out_b.split("\nsimulated ")[0]      # all but the wall time


def _fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _big(tmp_path):
    path = tmp_path / "big.trace"
    with open(path, "wb") as f:
        f.truncate(MAX_TRACE_BYTES + 1)
    return path


@pytest.mark.parametrize("make, words", [
    (lambda p: p / "missing.trace", "no such file"),
    (lambda p: p, "is a directory"),
    (_fifo, "not a regular file"),
    (lambda p: "/dev/zero", "not a regular file"),
    (_big, "more than a death trace file may have"),
    (lambda p: (p / "bin").write_bytes(b"\xff\xfe\x00\x01" * 10) and p / "bin", "not a text file"),
    (lambda p: (p / "t").write_text("1.0 3 7\n") and p / "t", "line 1: expected 'SECONDS WORKER'"),
    (lambda p: (p / "t").write_text("# ok\nsoon 3\n") and p / "t", "line 2: expected 'SECONDS WORKER'"),
    (lambda p: (p / "t").write_text("1.5 3.5\n") and p / "t", "line 1: expected 'SECONDS WORKER'"),
    (lambda p: (p / "t").write_text("nan 3\n") and p / "t", "finite number of seconds"),
    (lambda p: (p / "t").write_text("1e999 3\n") and p / "t", "finite number of seconds"),
    (lambda p: (p / "t").write_text("-1 3\n") and p / "t", "finite number of seconds"),
    (lambda p: (p / "t").write_text("1 8\n") and p / "t", "no worker 8 in this run (workers 0..7)"),
    (lambda p: (p / "t").write_text("1 -1\n") and p / "t", "no worker -1"),
    # Python's own number forms: 1_0 was read as 10 s, an Arabic-Indic digit as worker 3
    (lambda p: (p / "t").write_text("1_0 3\n") and p / "t", "line 1: expected 'SECONDS WORKER' (a number"),
    (lambda p: (p / "t").write_text("1 \u0663\n") and p / "t", "line 1: expected 'SECONDS WORKER' (a number"),
    (lambda p: "", "an empty path"),
])
def test_hostile_trace_files_are_one_line(tmp_path, capsys, make, words):
    path = make(tmp_path)
    assert main([str(a) for a in BASE + ["--death-trace", path]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hopdec sim: error: --death-trace") and words in err and "\n" not in err, err


# ---- what cannot be simulated, refused with one line -----------------------------------------------
@pytest.mark.parametrize("argv, words", [
    (["-n", 8, "--deaths", "3@1"], "simulated deaths need --fault-tolerance"),
    (["-n", 8, "--churn-mttf", "100"], "--churn-mttf: simulated deaths need --fault-tolerance"),
    (["-n", 8, "--fault-tolerance", "--deaths", "3@x"], "expected WORKER@SECONDS"),
    (["-n", 8, "--fault-tolerance", "--deaths", "3"], "expected WORKER@SECONDS"),
    (["-n", 8, "--fault-tolerance", "--deaths", "3@1_0"], "--deaths '3@1_0': expected WORKER@SECONDS"),
    (["-n", 8, "--fault-tolerance", "--deaths", "\u0663@1"], "expected WORKER@SECONDS"),
    (["-n", 8, "--fault-tolerance", "--deaths", ""], "--deaths '': empty value (expected WORKER@SECONDS"),
    (["-n", 8, "--fault-tolerance", "--deaths", "9@1"], "no worker 9 in this run"),
    (["-n", 8, "--fault-tolerance", "--deaths", "3@-1"],     # (the time as typed, not 3@-1.0)
     "--deaths 3@-1: expected a worker id >= 0 and a finite time >= 0"),
    (["-n", 8, "--fault-tolerance", "--churn-mttf", "0"], "--churn-mttf 0.0: must be"),
    (["-n", 8, "--fault-tolerance", "--deaths", "3@1", "--failure-detection", "-1"], "--failure-detection"),
    (["-n", 8, "--fault-tolerance", "--deaths", "3@1", "--protocol", "notify-ack"], "needs --protocol tokens"),
    (["-n", 8, "--fault-tolerance", "--deaths", "3@1", "--compress", "int8"], "--compress int8 with --fault"),
    (["--topology", "one-peer-exponential", "-n", 8, "--fault-tolerance", "--deaths", "3@1"], "time-varying"),
    (["--mode", "ps", "-n", 4, "--fault-tolerance", "--deaths", "0@1"], "the parameter server (rank 0) cannot die"),
    (["--mode", "ps", "-n", 4, "--fault-tolerance", "--deaths", "1@1", "--heal-stall", "1"], "--heal-stall is not used in --mode ps"),
    # they time the deaths the simulator injects: without any they were accepted and changed nothing
    *[(["-n", 8, *ft, opt, "1", *mode], f"{opt} is not used in --mode {mode[1] if mode else 'decentralized'}: it "
       "times simulated deaths, and none are asked for (--deaths, --death-trace or --churn-mttf) (drop it)")
      for opt in ("--heal-stall", "--failure-detection") for ft in ([], ["--fault-tolerance"])
      for mode in ([], ["--mode", "allreduce"]) if not (ft and mode)],     # (all-reduce refuses --fault-tolerance)
    (["--mode", "ps", "-n", 4, "--failure-detection", "1"], "--failure-detection is not used in --mode ps --sync bsp: "
                                                            "it times simulated deaths"),
    (["--mode", "ps", "-n", 2, "--fault-tolerance", "--deaths", "1@0.5,2@0.7", "--iterations", 50],
     "simulated death at virtual second 0.7: worker 2 was the last one"),
    (["-n", 2, "--fault-tolerance", "--deaths", "1@0.5", "--iterations", 50],
     "simulated death at virtual second 0.5: only 1 worker(s) left after the failure of rank(s) 1"),
    # every worker dead at the instant they all entered iteration 0: the gap meter's scan for the lowest
    # living iteration ran for ever (the simulation never ended)
    (["-n", 4, "--fault-tolerance", "--deaths", "0@0,1@0,2@0,3@0"],
     "simulated death at virtual second 0: only 0 worker(s) left after the failure of rank(s) 0, 1, 2, 3"),
])
def test_what_cannot_work_is_refused_with_one_line(argv, words, capsys):
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hopdec sim: error:") and words in err and "\n" not in err, err


def test_a_parameter_server_drops_its_dead_worker():
    res, out = sim(["--mode", "ps", "--sync", "bsp", "-n", 4, "--iterations", 30, "--compute-time", 0.05,
                    "--fault-tolerance", "--deaths", "2@0.4"])
    assert re.search(r"failure: worker 2 died after \d+ mini-batches .*SIMULATED", out), out
    assert "3 of 4 workers finished" in out and res["policy"].version == 30
    assert res["sim"].server.failed == [2]


# ---- the parameter server: the server finds a death --failure-detection later ------------------------
# Closed forms on a free network (no latency, no bytes): every mini-batch takes C virtual seconds, so BSP
# releases at C, 2C, ...; worker 2 dies at T, in the middle of the mini-batch that began at floor(T / C) * C.
PS_FREE = ["--mode", "ps", "-n", 4, "--iterations", 10, "--compute-time", 1, "--latency", 0, "--message-mb", 0,
           "--fault-tolerance", "--deaths", "2@2.5"]


def _ps(sync, detect, log_dir=None):
    argv = PS_FREE + ["--sync", *sync.split(), "--failure-detection", detect]
    return sim(argv + (["--log-dir", log_dir] if log_dir else []))


@pytest.mark.parametrize("detect", [0.0, 0.4, 0.75, 3.0])
def test_bsp_survivors_wait_for_the_server_to_find_the_death(detect, tmp_path):
    """BSP: the survivors push at 3 and the barrier waits for the dead worker until the server finds it at
    2.5 + detect (ULFM fails its receive; the policy still counts the worker until then); no stall follows
    (a PS run neither revokes nor shrinks), so the run ends max(0, 2.5 + detect - 3) later than 10."""
    res, out = _ps("bsp", detect, str(tmp_path / "logs"))
    late = max(0.0, 2.5 + detect - 3.0)
    assert abs(res["virtual_s"] - (10.0 + late)) < 1e-9, out
    for w in (1, 3, 4):
        _, recs, _ = log_lines(tmp_path / "logs", w)
        assert [r["iter"] for r in recs] == list(range(10))
        assert abs(recs[3]["time"] - (3.0 + late)) < 1e-9          # released when the server found it
        assert abs(recs[2]["wait_s"] - late) < 1e-9                   # what the survivors waited for
        assert all(abs(r["wait_s"]) < 1e-9 for r in recs[3:])          # then nothing: no recovery stall
    assert res["max_gap"] == 0 and "largest iteration gap observed: 0 (bound of --sync bsp: 0)" in out
    assert res["policy"].version == 10 and res["sim"].server.failed == [2]


def test_asp_goes_on_while_the_death_goes_unnoticed():
    """ASP: nobody waits for the dead worker, so the survivors' mini-batches are the same whether the
    server finds the death after 0.4 s or 5 s (until the budget, which loses the dead worker's share only
    when found); the server itself ends only once it found the death, as a real one's loop does."""
    quick, _ = _ps("asp", 0.4)
    slow, out = _ps("asp", 5.0)
    for w in (1, 3, 4):
        a, b = quick["stats"][w].entries, slow["stats"][w].entries
        assert a == b[:len(a)] and all(t == i for t, i in b)           # one mini-batch a second, no wait
    assert slow["sim"].notes("failure")[0]["time"] == 7.5
    late, _ = _ps("asp", 30.0)                                         # found after the survivors finished
    assert late["virtual_s"] == 32.5 and late["policy"].version == 40   # they did its share meanwhile
    assert all(not late["sim"].running(w) for w in (1, 3, 4))


def test_ssp_survivors_run_up_to_the_bound_of_the_dead_worker_then_wait():
    """SSP (staleness 2): until the death is found the dead worker is the slowest, so the survivors run 2
    pushes past it and wait; found at 32.5, they go on."""
    res, out = _ps("ssp --staleness 2", 30.0)
    for w in (1, 3, 4):
        entries = res["stats"][w].entries
        before = [i for t, i in entries if t < 32.5]
        assert max(before) == 4, entries                # the dead one pushed 2: ahead by 2, then waiting
        assert min(t for t, i in entries if i == 5) == 32.5
    assert res["max_gap"] == 2 and "(bound of --sync ssp: 2)" in out


def test_the_ps_death_is_logged_and_summarised_as_found(tmp_path):
    """The server's ``failure`` note (the one a real run writes) says when the worker died and when it was
    found, labelled simulated; the header records the detection delay and that nothing stalls."""
    logs = tmp_path / "logs"
    res, out = _ps("bsp", 0.75, str(logs))
    run, _, events = log_lines(logs, 0)
    (note,) = [e for e in events if e.get("what") == "failure"]
    assert note == dict(event="note", time=3.25, what="failure", worker=2, work=2, budget=32, version=2,
                        died_at=2.5, detect_s=0.75, simulated="SIMULATED (timing only)")
    d = run["simulated_deaths"]
    assert (d["detect_s"], d["heal_stall_s"], d["first_deaths"]) == (0.75, 0.0, [[2.5, 2]])
    assert ("deaths (SIMULATED (timing only)): 1 worker(s) died, 1 found and dropped by the server 0.75 "
            "virtual s after each death") in out
    assert "3 of 4 workers finished" in out


def test_a_ps_death_after_the_end_neither_happens_nor_keeps_the_run_going():
    res, out = sim(PS_FREE[:-1] + ["2@50", "--sync", "bsp"])
    assert res["virtual_s"] == 10.0 and not res["sim"].died and not res["sim"].server.failed
    assert "0 worker(s) died" in out


# ---- churn ----------------------------------------------------------------------------------------
def test_churn_draws_depend_on_seed_and_worker_only():
    a, b = churn_deaths(100.0, range(8), 1), churn_deaths(100.0, range(16), 1)
    assert a == b[:8] and a != churn_deaths(100.0, range(8), 2)
    assert all(t > 0 for t, _ in a)


def test_a_thousand_workers_with_churn():
    """1,000 workers, a death every ~0.3 virtual s: each heal is the whole graph's, the survivors finish."""
    res, out = sim(["--topology", "ring-based", "-n", 1000, "--iterations", 12, "--compute-time", 0.1,
                    "--message-mb", 1, "--fault-tolerance", "--churn-mttf", 300, "--seed", 3,
                    "--invariants", "off"])
    c = res["churn"]
    assert len(c.died) >= 2 and len(c.heals) >= 1
    assert len(c.alive) == 1000 - len(c.died) == c.graph.number_of_nodes()
    assert all(c.sim.cores[r].iteration == 11 and c.sim.done[r] for r in c.alive)
    assert f"{len(c.alive)} survivors finished" in out


def random_directed(n, extra, seed):
    """A random directed graph: two rings through random orders (strongly connected, in-degree 2 mostly)
    plus random edges."""
    import random
    rng = random.Random(seed)
    g = nx.DiGraph()
    for _ in range(2):
        order = rng.sample(range(n), n)
        g.add_edges_from((order[i], order[(i + 1) % n]) for i in range(n))
    pairs = [(u, v) for u in range(n) for v in range(n) if u != v]
    g.add_edges_from(rng.sample(pairs, extra))
    return T.with_default_weights(g)


GRAPHS = {"ring_based_8": lambda: T.load("topologies/ring_based_8.json"), "exponential_8": lambda: T.load(EXP8),
          "torus_3x4": lambda: T.torus(3, 4), "random_directed_10": lambda: random_directed(10, 8, seed=5)}
MECHANISMS = [dict(), dict(backup_workers=1), dict(staleness=2), dict(max_ig=3, backup_workers=1,
                                                                      skip_max_jump=3, skip_trigger=2)]


@pytest.mark.parametrize("mech", MECHANISMS, ids=lambda m: ",".join(f"{k}={v}" for k, v in m.items()) or "tokens")
@pytest.mark.parametrize("graph", list(GRAPHS))
def test_churn_with_invariants_at_every_event(graph, mech):
    """Small graphs, every mechanism, a straggler, three deaths (two at the same instant), deaths during a
    recovery and with no detection delay: invariants at every event; the survivors finish."""
    g = GRAPHS[graph]()
    cfg = ProtocolConfig(iterations=40, fault_tolerant=True, **mech)
    views = node_views(g)
    cm = ComputeModel(["normal:mean=0.05,std=0.01"], sorted(g.nodes), seed=1, slowdowns=["rank=1,factor=3"])
    deaths = [(0.3, 3), (0.3, 5), (0.31, 6)] if graph != "ring_based_8" else [(0.3, 3), (0.9, 6)]
    for detect, stall in ((0.05, 0.02), (0.0, 0.0)):
        s = HopSim(views, cfg, cm.step, network=LinkModel(bandwidth=1e7, latency=0.002), message_bytes=2e5)
        inv = Invariants(g, cfg)
        c = Churn(s, g, deaths, detect, stall, invariants=inv)
        s.check = c.check
        s.run()
        assert inv.checks == s.q.events > 300
        assert sorted(c.alive) == sorted(set(g.nodes) - {w for _, w in deaths})
        if detect and graph != "ring_based_8":      # 6 died during the recovery from 3 and 5: folded in
            assert [h["failed"] for h in c.heals] == [[3, 5, 6]]
        assert all(s.done[r] and s.cores[r].iteration == 39 for r in c.alive), s.describe()


# ---- the same deaths as a real run: tests/test_fault_tolerance_mpi.py (its kill -9 run is simulated too,
# and the heals compared, without a second MPI job)


def test_the_reports_gap_counts_a_dead_worker_only_until_its_heal(tmp_path):
    """The report drew the survivors' gap growing without bound against the dead worker (50 > bound 4 in
    a 16-worker ring-based run with two deaths) while the summary said 1: a worker declared dead counts
    until the heal that removed it, in the sweep and in the pair matrix."""
    from hopdec.cli.main import main as cli_main
    from hopdec.report.data import Run
    from hopdec.report.gaps import gap_sweep, largest_gap, max_iteration_gap
    # the functions: worker 2 stops at iteration 1; removed at t=2.5, the others go on to 5
    entries = [[(t, t) for t in range(6)], [(t, t) for t in range(6)], [(0, 0), (1, 1)]]
    assert largest_gap(entries) == 4 and largest_gap(entries, [None, None, 2.5]) == 1
    assert max(g for t, g in gap_sweep(entries, [None, None, 2.5]) if t > 2.5) == 0
    m = max_iteration_gap(entries, [None, None, 2.5])
    assert m.max() == 1 and m[0, 2] == 1
    logs = tmp_path / "logs"
    assert cli_main(["sim", "--topology", "ring-based", "-n", "16", "--iterations", "60", "--fault-tolerance",
                     "--deaths", "3@1.0,6@2.0", "--log-dir", str(logs)]) == 0
    run = Run.load(str(logs))
    assert sorted(run.removed_at()) == [3, 6]
    _, gaps = run.gap_over_time()
    assert 0 < gaps.max() <= 4                                 # the healed graph's bound, not 50
    assert run.gap_matrix().max() <= 4


def test_the_report_drops_a_dead_ps_worker_when_the_server_did(tmp_path):
    """``hopdec report`` on a PS run with a death drew the survivors' gap growing against the dead worker
    (15 > BSP's bound 0, marked EXCEEDED) and listed no failure: the server's ``failure`` note removes it
    from the gap, its released mini-batch counts until then, and the page lists the death."""
    from hopdec.report.data import Run
    from hopdec.report.html import _failures_html
    logs = tmp_path / "logs"
    _ps("bsp", 0.75, str(logs))
    run = Run.load(str(logs))
    assert run.removed_at() == {2: 3.25}
    t, gaps = run.gap_over_time()
    assert list(t[2:4]) == [2.0, 3.25] and gaps.max() == 0 and run.gap_matrix().max() == 0
    page = _failures_html(run)
    assert "Simulated deaths (1 worker(s)" in page and "worker 2 died at 2.5 virtual s" in page
    assert "the server dropped it at 3.25 virtual s, after its 2 mini-batches" in page


def test_a_bsp_death_with_weights_on_the_way_keeps_the_gap_at_the_bound(tmp_path):
    """16 workers through the server's NIC: worker 3 dies after pushing mini-batch 19, with the weights of 20
    still on the way to it, so its log closes neither; both count until the server drops it (the summary and
    the report said 1 > BSP's bound 0 with only the last one counted)."""
    from hopdec.report.data import Run
    logs = tmp_path / "logs"
    res, out = sim(["--mode", "ps", "--sync", "bsp", "-n", 16, "--iterations", 30, "--compute-time", 0.1,
                    "--message-mb", 1, "--fault-tolerance", "--deaths", "3@2.55", "--log-dir", str(logs)])
    assert [(t, i) for t, i in res["sim"].entered(3)] == [(pytest.approx(2.4119, abs=1e-4), 19),
                                                       (pytest.approx(2.5389, abs=1e-4), 20)]
    assert res["stats"][3].entries[-1][1] == 18 and res["max_gap"] == 0
    run = Run.load(str(logs))
    assert run.gap_over_time()[1].max() == 0 and run.gap_matrix().max() == 0


@pytest.mark.parametrize("argv", [["--topology", EXP8, "--deaths", ",".join(f"{w}@{0.1 * w:g}" for w in range(8))],
                                  ["--mode", "ps", "-n", 3, "--deaths", "1@0.1,2@0.2,3@0.3"]])
def test_a_run_the_deaths_end_keeps_its_records_and_heals_in_the_logs(argv, tmp_path):
    """Deaths of every worker end the run with one line, as a real run's -- but the simulator had kept its
    records in memory and lost them: the logs held their headers only, nothing of what died when. Now
    they hold every record and heal up to the end, and the line says where they are."""
    d = tmp_path / "run"
    with pytest.raises(Exception) as err:
        sim(argv + ["--iterations", 30, "--compute-time", 0.05, "--fault-tolerance", "--log-dir", d])
    assert f"(the records up to then are in {d}/rank*.jsonl)" in str(err.value)
    assert type(err.value).__name__ in ("CannotHeal", "HopdecError", "ConfigError"), err.value
    records = {p.name: [json.loads(x) for x in p.read_text().splitlines()] for p in d.glob("rank*.jsonl")}
    assert sum(1 for lines in records.values() for x in lines if "iter" in x) >= 6
    if "--topology" in argv:
        heals = [x for x in records["rank7.jsonl"] if x.get("event") == "heal"]
        assert heals and heals[0]["failed"][0] == 0 and heals[0]["died_at"][0] == 0.0


def test_a_burst_of_deaths_is_one_short_failure_line(tmp_path):
    """43 workers dying at once made one summary line of 43 rank numbers (90 among 2,000 workers: a screen);
    the line names the first ones and counts them, the logs' heal event lists every one."""
    failed = list(range(3, 300, 7))
    res, out = sim(["--topology", "ring-based", "-n", 300, "--iterations", 10, "--fault-tolerance", "--invariants",
                    "off", "--deaths", ",".join(f"{w}@0.5" for w in failed), "--log-dir", tmp_path / "run"])
    line = next(x for x in out.splitlines() if "failure: rank(s) 3," in x)
    assert "3, 10, 17, 24, 31, 38, 45, 52, 59, 66, ..., 297 (43 in all) died near iteration" in line, line
    _, _, events = log_lines(tmp_path / "run", 1)
    assert [e["failed"] for e in events if e["event"] == "heal"] == [failed]
