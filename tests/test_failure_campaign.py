"""experiments/failure_campaign.py's judgement of a job, without running one (the campaign itself runs
real jobs for minutes: experiments/README.md has its results)."""

import os
import random
import sys

import networkx as nx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import failure_campaign as fc  # noqa: E402

FT_PS_LATE = dict(ft=True, ps=True, phase="shutdown", how="exit", victim=2)
HOP = dict(ft=False, ps=False, phase="train", how="exit", victim=1)
LOOP_HANG_END = dict(ft=False, ps=False, phase="shutdown", how="hang", victim=1, loop=True)
BOX = "Process name: [prterun-vm-1@1,1]\n   Exit code:    17\n"


def test_a_job_is_flagged_for_each_broken_promise():
    assert fc.judge(None, "", "", HOP) == "never ended"
    assert fc.judge(3, "", "hopdec train: error: a\nhopdec train: error: b\n", HOP) == "more than one error line"
    assert fc.judge(17, "", "", HOP) == "failed without a line"
    assert fc.judge(0, "no table", "", HOP) == "exit 0 without a summary"
    assert fc.judge(0, "== ps ==\n", "", FT_PS_LATE) == "a worker's death after training not named"
    assert fc.judge(0, "== consensus\n", "", dict(HOP, how="sysexit", loop=True)) == "a failure ended 0"
    assert fc.judge(0, "== hop ==\n", "", dict(HOP, how="raise")) == "a failure ended 0"
    assert fc.judge(None, "", "", dict(LOOP_HANG_END, phase="consensus")) == "never ended"
    healed = dict(ft=True, ps=False, phase="built", how="exit", victim=0, loop=True)
    assert fc.judge(3, "", "hopdec: error: rank 4: MPI_ERR_PROC_FAILED\n", healed) == \
        "a death fault tolerance heals ended the job"
    assert fc.judge(3, "", "hopdec train: error: the parameter server died\n", dict(healed, ps=True, loop=False,
                                                                                  phase="train")) == ""


def test_what_a_job_should_do_is_not_flagged():
    assert fc.judge(17, "", BOX, HOP) == ""                     # Open MPI's box names the crashed rank
    wrapped = "prterun noticed that process rank 2 with PID 9514 on node vm exited on\nsignal 10 (User defined signal 1).\n"
    assert fc.judge(143, "", wrapped, HOP) == ""                # (its lines wrapped)
    assert fc.judge(3, "", "hopdec train: error: rank 1: boom\n", HOP) == ""
    assert fc.judge(0, "== hop ==\n", "", HOP) == ""
    stop = "hopdec train: stopped after 1 of 75 mini-batches (server version 1) (SIGTERM to the launcher); ...\n"
    assert fc.judge(143, "", stop, HOP) == ""                  # a clean stop's line is a line
    assert fc.judge(0, "== ps ==\nfailure: worker 2 died after its training ended\n", "", FT_PS_LATE) == ""
    assert fc.judge(None, "== consensus\n", "", LOOP_HANG_END) == ""   # the user's code, after hopdec's last call


def test_the_draws_are_seeded_and_valid():
    a = [fc.draw(random.Random(7), 25) for _ in range(1)]
    assert a == [fc.draw(random.Random(7), 25)]
    for n, args, f in (fc.draw(random.Random(s), 25) for s in range(50)):
        assert 0 <= f["victim"] < n and args[args.index("--die-rank") + 1] == str(f["victim"])
        assert ("--fault-tolerance" in args) == f["ft"] and ("--sync" in args) == f["ps"]
        assert "ring-based" not in args or n % 2 == 0, args     # (refused with an odd n: nothing tested)
        graph = args[args.index("--topology") + 1] if "--topology" in args else ""
        if graph.startswith("random:") and "--backup-workers" in args:
            assert min(d for _, d in fc.random_digraph(n, int(graph[7:])).in_degree()) >= 2


def test_a_random_graph_is_written_as_an_edge_list_hopdec_reads(tmp_path):
    from hopdec.topology import load
    path = fc.edge_list_file(5, "random:9", str(tmp_path))
    g = load(path)
    assert sorted(g.nodes) == list(range(5))
    assert {(u, v) for u, v in g.edges if u != v} == set(fc.random_digraph(5, 9).edges)
    assert any(args[args.index("--topology") + 1].startswith("random:")
               for _, args, f in (fc.draw(random.Random(s), 25) for s in range(40)) if not f["ps"])


def test_the_loop_draws_are_seeded_and_valid():
    assert fc.draw_loop(random.Random(3), 20) == fc.draw_loop(random.Random(3), 20)
    for n, args, f in (fc.draw_loop(random.Random(s), 20) for s in range(80)):
        assert 0 <= f["victim"] < n and args[args.index("--victim") + 1] == str(f["victim"]) and f["loop"]
        graph = args[args.index("--topology") + 1]
        assert graph != "ring-based" or n % 2 == 0, (n, graph)
        assert graph != "torus" or n == 4, (n, graph)


def test_the_loop_draws_cover_random_graphs_local_steps_and_compression_where_allowed():
    draws = [fc.draw_loop(random.Random(s), 20) for s in range(200)]
    graphs = [args[args.index("--topology") + 1] for _, args, _ in draws]
    assert sum(g.startswith("random:") for g in graphs) > 40
    for n, args, f in draws:
        graph = args[args.index("--topology") + 1]
        if graph.startswith("random:"):
            g = fc.random_digraph(n, int(graph.split(":")[1]))
            assert sorted(g) == list(range(n)) and nx.is_strongly_connected(g)
            if "--backup-workers" in args:          # every rank hears from 2 others: 1 backup is allowed
                assert min(d for _, d in g.in_degree()) >= 2
        if "--local-steps" in args or "--compress" in args:
            assert not f["ft"]                      # (neither is supported with fault tolerance)
    assert any("--local-steps" in a for _, a, _ in draws) and any("--compress" in a for _, a, _ in draws)
    assert fc.random_digraph(5, 9).edges == fc.random_digraph(5, 9).edges


def test_a_loops_second_job_must_resume_from_the_latest_checkpoint_every_rank_saved():
    f = dict(ft=False, ps=False, phase="train", how="exit", victim=1, loop=True, every=3)
    keys = [{3, 6, 9}, {3, 6}, {3, 6, 9}]
    done = "== consensus of 20 steps: accuracy 0.80 on rank 0's data\n"
    assert fc.judge_loop_resume(0, "resumed at 6\n" + done, "", f, keys) == ""
    assert fc.judge_loop_resume(0, "resumed at 9\n" + done, "", f, keys) == \
        "resumed at 9, not at the latest common 6"
    assert fc.judge_loop_resume(0, done, "", f, keys) == "resumed at None, not at the latest common 6"
    assert fc.judge_loop_resume(0, done, "", f, [{3}, set(), {3}]) == ""          # nothing common: from scratch
    assert fc.judge_loop_resume(3, "", "hopdec: error: rank 1: x\n", f, keys) == "the resumed loop failed"
    for n, args, g in (fc.draw_loop_resume(random.Random(s), 20) for s in range(40)):
        assert g["phase"] == "train" and ("--victim" in args) == ("after" not in g), args
        assert args[args.index("--every") + 1] == str(g["every"])
