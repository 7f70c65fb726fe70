"""Options the chosen mode would ignore are refused in one line (issue 17 item 9), for the whole class:
every option of a group the mode does not take, and the options a group's own values leave unused; a
log directory holding another run's logs is refused (or replaced with --overwrite), and a reader never
merges two runs' rank files."""

import io
import json
import os

import pytest

from hopdec.cli.sim import parse as sim_parse
from hopdec.cli.train import parse as train_parse
from hopdec.errors import ConfigError
from hopdec.settings import MODES, PS, Protocol
from hopdec.sim.run import simulate
from fake_comm import SizedComm

VALUES = {"--max-ig": "3", "--backup-workers": "1", "--staleness": "2", "--topology": "ring",
          "--protocol": "notify-ack", "--compute-graph": "serial", "--stale-reduce": "plain",
          "--skip": "max-jump=4,trigger=2", "--compress": "fp16", "--lookahead": "5", "--esync-epsilon": "0.1",
          "--sync": "ssp", "--staleness-range": "2,6", "--local-steps": "4", "--outer-optimizer": "sgd",
          "--outer-lr": "0.5", "--outer-momentum": "0.5"}
"""A valid value of every option of the protocol and PS groups."""
SHARED = {"--backup-workers", "--staleness"}
"""Options both the protocol and the PS group take (each mode reads them its own way)."""


def assert_refused(argv, says, parse=train_parse):
    with pytest.raises(ConfigError) as err:
        parse([str(a) for a in argv])
    line = str(err.value)
    assert "\n" not in line and says in line, line
    return line


@pytest.mark.parametrize("opt", sorted(set(Protocol.options().values()) - SHARED))
@pytest.mark.parametrize("mode", ["ps", "allreduce"])
def test_every_decentralized_option_is_refused_in_the_other_modes(mode, opt):
    line = assert_refused(["--mode", mode, opt, VALUES[opt]], f"{opt} is not used in --mode {mode}")
    assert "decentralized mode only" in line


@pytest.mark.parametrize("opt", sorted(set(PS.options().values()) - SHARED - {"--sync"}))
@pytest.mark.parametrize("mode", ["decentralized", "allreduce"])
def test_every_parameter_server_option_is_refused_in_the_other_modes(mode, opt):
    assert_refused(["--mode", mode, opt, VALUES[opt]], f"{opt} is not used in --mode {mode}")


@pytest.mark.parametrize("opt", sorted(SHARED))
def test_a_shared_option_is_refused_where_no_group_of_the_mode_takes_it(opt):
    assert_refused(["--mode", "allreduce", opt, VALUES[opt]], f"{opt} is not used in --mode allreduce")


@pytest.mark.parametrize("argv, says", [
    (["--sync", "dssp", "--staleness", "2"], "--staleness is not used in --mode ps --sync dssp"),
    (["--sync", "bsp", "--lookahead", "3"], "--lookahead is not used in --mode ps --sync bsp"),
    (["--sync", "ssp", "--backup-workers", "1"], "--backup-workers is not used in --mode ps --sync ssp"),
    (["--sync", "ssp", "--topology", "ring"], "--topology is not used in --mode ps --sync ssp"),
    (["--protocol", "notify-ack", "--max-ig", "3"], "--max-ig is not used in --mode decentralized"),
    (["--stale-reduce", "plain"], "--stale-reduce is not used in --mode decentralized"),
    (["--model", "mlp", "--norm", "group"], "--norm is not used"),
    (["--data-dir", "x"], "--data-dir is not used"),
    (["--sync", "ssp", "--consensus-every", "2"], "--consensus-every is not used in --mode ps"),
    (["--mode", "allreduce", "--fault-tolerance"], "--fault-tolerance is not used in --mode allreduce"),
    (["--mode", "allreduce", "--compress", "fp16"], "--compress is not used in --mode allreduce"),
    (["--skip", "max-jump=0,trigger=0"], "--skip 'max-jump=0,trigger=0': max-jump must be in [2,"),
    (["--skip", "max-jump=1"], "a jump of 0 or 1 never skips anything"),
    (["--log-dir", ""], "--log-dir '': must be a directory, not empty"),
    (["--trace", " "], "--trace ' ': must be a file, not empty"),
    (["--overwrite"], "--overwrite needs --log-dir"),
    # was accepted and ignored: no progress lines to space out
    (["--no-progress", "--progress-interval", "5"],
     "--progress-interval is not used in --mode decentralized: --no-progress prints no progress lines"),
])
def test_an_option_the_run_would_ignore_is_one_line(argv, says):
    assert_refused(argv, says)


def test_the_python_apis_default_interval_beside_no_progress_is_not_refused():
    """Only a typed --progress-interval is refused with --no-progress: HopOptimizer's defaults are
    progress=False, progress_interval=3.0."""
    from hopdec.optim.assembly import observe_settings
    assert observe_settings(None, False, 3.0, None).progress is False


def test_abbreviated_and_equals_forms_count_as_typed():
    assert_refused(["--sync=ssp", "--lookah", "3"], "--lookahead is not used in --mode ps --sync ssp")


def test_defaults_and_options_the_mode_reads_pass():
    assert train_parse(["--sync", "ssp", "--staleness", "2"]).ps.staleness == 2
    assert train_parse(["--sync", "elastic", "--lookahead", "3"]).ps.lookahead == 3
    s = train_parse(["--mode", "allreduce", "--lr", "0.1", "--slowdown", "rank=1,factor=3", "--log-dir", "x"])
    assert s.mode == "allreduce" and s.work.lr == 0.1 and s.observe.log_dir == "x"
    s = train_parse(["--protocol", "tokens", "--max-ig", "3", "--staleness", "1", "--stale-reduce", "plain"])
    assert (s.protocol.max_ig, s.protocol.staleness, s.protocol.stale_reduce) == (3, 1, "plain")


def test_the_simulator_refuses_the_same(tmp_path):
    assert_refused(["--mode", "allreduce", "-n", "4", "--max-ig", "3"], "--max-ig is not used in --mode allreduce",
            parse=sim_parse)
    assert_refused(["--mode", "ps", "-n", "4", "--compress", "fp16"], "--compress is not used in --mode ps",
            parse=sim_parse)
    assert_refused(["-n", "4", "--progress-interval", "1", "--no-progress"],
                   "--progress-interval is not used in --mode decentralized: --no-progress", parse=sim_parse)


@pytest.mark.parametrize("opt, value", [("--send-path", "copy"), ("--eager-limit", "4096"), ("--rendezvous", "push")])
@pytest.mark.parametrize("mode", [["--mode", "ps"], ["--sync", "asp"], ["--mode", "allreduce"]])
def test_the_simulators_send_model_is_refused_outside_decentralized_mode(mode, opt, value):
    """Only the Hop simulator models how sends complete (hopdec.sim.sends); a PS or all-reduce run took
    these options and ran exactly as without them (found by a seeded fuzz of hopdec sim)."""
    line = assert_refused([*mode, "-n", "3", opt, value], f"{opt} is not used in --mode {mode[1]}"
                          if mode[0] == "--mode" else f"{opt} is not used in --mode ps --sync asp", parse=sim_parse)
    assert "hopdec.sim.sends" in line
    assert getattr(sim_parse(["-n", "3", opt, value]).cost, opt[2:].replace("-", "_")) is not None


def sim(argv):
    return simulate(sim_parse([str(a) for a in argv]), out=io.StringIO())


def test_a_log_dir_with_an_earlier_runs_logs_is_refused_and_overwrite_replaces_them(tmp_path):
    d = tmp_path / "logs"
    sim(["-n", 4, "--iterations", 2, "--log-dir", d])
    with pytest.raises(ConfigError, match=r"--log-dir .*: holds the logs of an earlier run \(rank0.jsonl"):
        sim(["-n", 4, "--iterations", 2, "--log-dir", d])
    sim(["-n", 2, "--iterations", 2, "--log-dir", d, "--overwrite"])
    assert sorted(os.listdir(d)) == ["rank0.jsonl", "rank1.jsonl"]       # no rank of the earlier run left


def test_a_run_refused_after_the_log_dir_check_leaves_no_empty_log(tmp_path):
    """The check tried DIR/rank0.jsonl by creating it; a later refusal (a torus of 3) left it empty, where
    it looked like a run's log. A FIFO that was there stays (the check only reads what it finds)."""
    d = tmp_path / "logs"
    with pytest.raises(ConfigError, match="torus needs n >= 4"):
        sim(["-n", 3, "--topology", "torus", "--log-dir", d])
    assert os.listdir(d) == []
    sim(["-n", 4, "--topology", "torus", "--iterations", 2, "--log-dir", d])     # then the run writes them
    assert sorted(os.listdir(d)) == [f"rank{r}.jsonl" for r in range(4)]
    fifo = tmp_path / "fifo"
    os.mkdir(fifo)
    os.mkfifo(fifo / "rank0.jsonl")
    with pytest.raises(ConfigError, match="is not a regular file"):
        sim(["-n", 4, "--iterations", 2, "--log-dir", fifo])
    assert os.listdir(fifo) == ["rank0.jsonl"]


def _checkpoints_logged_in(ck, log_dir, ranks=(0, 1)):
    """A --checkpoint-dir whose manifests say each rank logged to ``log_dir`` (as a run with --log-dir writes)."""
    from hopdec.runtime import checkpoint as C
    for r in ranks:
        os.makedirs(ck / f"rank{r}")
        entry = {"file": "ckpt-00000004.npz", "iteration": 4, "log": os.path.join(os.path.abspath(log_dir),
                                                                                  f"rank{r}.jsonl"), "log_offset": 0}
        (ck / f"rank{r}" / C.MANIFEST).write_text(json.dumps({"format": C.FORMAT, "complete": {"4": entry}}))
    return ck


def test_a_resume_into_another_runs_log_dir_is_refused_during_setup(tmp_path):
    """--resume skipped the check of --log-dir altogether: resumed into a folder holding another run's logs
    (not the one its checkpoints logged to), it wrote over them without --overwrite, and left the rest of that
    run's rank files beside its own (hopdec report then refused the folder as two runs)."""
    from hopdec.runtime.setup import check_fresh_log_dir
    own, other = tmp_path / "own", tmp_path / "other"
    os.makedirs(own)
    os.makedirs(other)
    for r in range(3):
        (other / f"rank{r}.jsonl").write_text(f'{{"rank": {r}, "run": {{"mode": "allreduce"}}}}\n')
    (own / "rank0.jsonl").write_text('{"rank": 0, "run": {}}\n')
    ck = _checkpoints_logged_in(tmp_path / "ck", own)
    for r in (0, 1):
        with pytest.raises(ConfigError, match=f"--log-dir {other}: holds the logs of an earlier run"):
            check_fresh_log_dir(str(other), r, 2, resume_dir=str(ck))
        check_fresh_log_dir(str(own), r, 2, resume_dir=str(ck))                 # its own: continued
        check_fresh_log_dir(str(tmp_path / "new"), r, 2, resume_dir=str(ck))   # a new folder: fine
    check_fresh_log_dir(str(other), 0, 2, overwrite=True, resume_dir=str(ck))  # --overwrite: replaced
    assert sorted(os.listdir(other)) == ["rank0.jsonl", "rank1.jsonl"]


def test_a_real_run_refuses_another_runs_log_dir_during_setup(tmp_path):
    from hopdec.runtime.setup import check_fresh_log_dir
    (tmp_path / "rank3.jsonl").write_text('{"rank": 3, "run": {}}\n')
    (tmp_path / "rank1.jsonl").write_text("")                 # this run's rank 1 made it: not a log yet
    with pytest.raises(ConfigError, match="rank3.jsonl"):
        check_fresh_log_dir(str(tmp_path), 0, 2)
    check_fresh_log_dir(str(tmp_path), 1, 2)                  # rank 1 has none of its own: rank 0 says it
    ck = _checkpoints_logged_in(tmp_path / "ck", tmp_path)
    check_fresh_log_dir(str(tmp_path), 0, 2, resume_dir=str(ck))   # a resume continues its own logs
    check_fresh_log_dir(str(tmp_path), 0, 2, overwrite=True)
    assert not (tmp_path / "rank3.jsonl").exists() and (tmp_path / "rank1.jsonl").exists()


def test_a_file_another_rank_removes_while_rank_0_looks_is_no_error(tmp_path, monkeypatch):
    """Each rank's check of --log-dir makes its file and removes it again: rank 0 listing the folder meanwhile
    saw rank1.jsonl, which was gone when it read its size -- 'FileNotFoundError: ... rank1.jsonl' ended a
    clean-clone CI run's job (exit 2) before any training. A file gone meanwhile is no earlier run's log."""
    from hopdec.runtime import setup
    (tmp_path / "rank1.jsonl").write_text("")                 # rank 1's trial file, about to be removed
    real = os.path.isfile

    def removed_after(path):
        found = real(path)
        if path.endswith("rank1.jsonl") and found:
            os.unlink(path)                                   # rank 1 removes it right after rank 0 looked
        return found
    monkeypatch.setattr(setup.os.path, "isfile", removed_after)
    setup.check_fresh_log_dir(str(tmp_path), 0, 2)
    assert os.listdir(tmp_path) == []


def test_the_readers_refuse_rank_files_of_two_runs(tmp_path):
    from hopdec.cli import report
    a, b = tmp_path / "a", tmp_path / "b"
    sim(["-n", 4, "--iterations", 2, "--log-dir", a])
    sim(["-n", 4, "--iterations", 2, "--log-dir", b, "--seed", 1])     # (the same simulation: the same id)
    os.replace(b / "rank3.jsonl", a / "rank3.jsonl")
    for cmd in ("report", "plot", "trace"):
        with pytest.raises(ConfigError, match=r"rank files of 2 different runs \(rank0.jsonl is run \w+, "
                                               r"rank3.jsonl run \w+\)"):
            getattr(report, f"{cmd}_main")([str(a), "-o", str(tmp_path / "out")])


# ---- ranges a machine can do (issue 17 item 10) -------------------------------------------------
@pytest.mark.parametrize("argv, says", [
    (["--compute-time", "1e9"], "--compute-time 1000000000.0: must be a finite number of seconds in (0, 3600]"),
    (["--lr", "1e300"], "--lr 1e+300: must be a finite number in (0, 1000]"),
    (["--weight-decay", "1e300"], "--weight-decay 1e+300: must be a finite number in [0, 1000]"),
    (["--slowdown", "rank=1,factor=1e308"], "factor 1e+308 must be in [1, 1000]"),
    (["--iterations", str(10 ** 12)], "--iterations 1000000000000: must be an integer in [1, 1e+09]"),
    (["--batch-size", str(2 ** 40)], "--batch-size"),
    (["--max-ig", str(10 ** 9)], "--max-ig"),
    (["--peer-timeout", "1e300"], "--peer-timeout"),
    (["--compute-time", "100", "--peer-timeout", "60"], "longer than --peer-timeout 60"),
    (["--compute-time", "1", "--slowdown", "rank=1,factor=200"], "with --slowdown factors up to 200x"),
])
def test_a_huge_finite_number_is_refused_before_anything_starts(argv, says):
    assert_refused(argv, says)


@pytest.mark.parametrize("argv, says", [
    (["-n", str(10 ** 7)], "more than hopdec handles"),
    (["-n", "4", "--compute-time", "1e300"], "at most 1e+06 s"),
    (["-n", "4", "--latency", "1e300"], "--latency"),
    (["-n", "4", "--bandwidth", "1e-300"], "must be at least"),
])
def test_the_simulators_ranges(argv, says):
    with pytest.raises(ConfigError) as err:
        sim(argv)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["0.07", "0.5"])         # 0.07 is the default: typed, it was accepted
def test_heal_stall_is_refused_for_a_parameter_server_even_at_its_default(value):
    assert_refused(["--mode", "ps", "--sync", "bsp", "-n", 4, "--fault-tolerance", "--deaths", "1@1",
                    "--heal-stall", value], "--heal-stall is not used in --mode ps", parse=sim_parse)


# ---- iteration skipping that can never skip (Hop sec. 5 pairs it with backup workers or staleness) ----
@pytest.mark.parametrize("extra", [[], ["--staleness", "0"], ["--compute-graph", "serial"]])
def test_skipping_without_backup_workers_or_staleness_is_refused(extra):
    """``--skip`` alone ran and never jumped, silently (the README's HopOptimizer example had
    ``skip=...`` without backup workers): an out-neighbour j of a straggler i needs i's update m for its
    Recv(m), so j is never 2 iterations past i, the least a jump needs. Measured before the refusal, ring(8)
    with rank 3 four times slower, 60 iterations, ``--skip max-jump=2,trigger=1``: 0 jumps alone, with
    --staleness 0 or serial compute; 29 with --backup-workers 1 or --staleness 1."""
    with pytest.raises(ConfigError) as err:
        sim(["-n", 8, "--topology", "ring", "--iterations", 5, "--skip", "max-jump=2,trigger=1", *extra])
    line = str(err.value)
    assert "\n" not in line and line.startswith("--skip max-jump=2,trigger=1: never skips without "
                                                "--backup-workers or --staleness >= 1"), line


@pytest.mark.parametrize("extra", [["--backup-workers", "1"], ["--staleness", "1"]])
def test_skipping_with_backup_workers_or_staleness_jumps(tmp_path, extra):
    sim(["-n", 8, "--topology", "ring", "--iterations", 40, "--slowdown", "rank=3,factor=4",
         "--skip", "max-jump=2,trigger=1", "--log-dir", tmp_path, *extra])
    assert _jumps(tmp_path, 3) >= 5


def _jumps(log_dir, rank):
    import json
    with open(log_dir / f"rank{rank}.jsonl") as f:
        return sum("jumped_from" in r for r in (json.loads(line) for line in f if '"iter"' in line))


def test_skipping_alone_on_a_schedule_jumps_only_where_a_worker_sends_nothing_at_some_step(tmp_path):
    """A one-peer schedule sends at every step, so skipping alone never jumps there either (0 jumps measured
    at 8 and 16 workers, max_ig 2 to 8): refused. A schedule with a step where a worker sends nothing lets its
    out-neighbours get ahead, and the straggler jumps."""
    with pytest.raises(ConfigError, match="^--skip max-jump=2,trigger=1: never skips without --backup-workers"):
        sim(["-n", 8, "--topology", "one-peer-exponential", "--iterations", 5, "--skip", "max-jump=2,trigger=1"])
    import json
    ring = [[i, (i + 1) % 4] for i in range(4)] + [[(i + 1) % 4, i] for i in range(4)]
    path = tmp_path / "idle.json"
    path.write_text(json.dumps({"steps": [ring, []], "nodes": [{"id": i} for i in range(4)]}))
    sim(["--topology", path, "--iterations", 40, "--slowdown", "rank=2,factor=6", "--skip", "max-jump=2,trigger=1",
         "--log-dir", tmp_path / "logs"])
    assert _jumps(tmp_path / "logs", 2) >= 5


def test_backup_workers_from_the_topology_file_let_a_straggler_skip(tmp_path):
    """A node's ``backup_workers`` in the topology file is backup workers too: skipping is accepted and jumps."""
    import json
    nodes = [{"id": i, "backup_workers": 1} for i in range(4)]
    links = [{"source": i, "target": (i + d) % 4} for i in range(4) for d in (1, 3)]
    path = tmp_path / "ring4.json"
    path.write_text(json.dumps({"directed": True, "nodes": nodes, "links": links}))
    sim(["--topology", path, "--iterations", 40, "--slowdown", "rank=2,factor=6", "--skip", "max-jump=2,trigger=1",
         "--log-dir", tmp_path / "logs"])
    assert _jumps(tmp_path / "logs", 2) >= 5


def test_a_skip_trigger_above_max_ig_is_refused_on_a_graph_whose_edges_go_both_ways(tmp_path):
    """On a symmetric graph a straggler's out-neighbours also send to it: its token queues keep them within
    max_ig iterations (Hop Theorem 2), so a trigger above max_ig never fires. Measured before the refusal,
    ring(8), rank 3 six times slower, backup workers 1, 80 iterations: trigger 2 / 3 with max_ig 2: 39 / 0
    jumps; trigger 3 / 4 with max_ig 3: 26 / 0 (0 with --staleness 3 as well). On a directed ring an
    out-neighbour does not send back (it may get further ahead): accepted."""
    with pytest.raises(ConfigError) as err:
        sim(["-n", 8, "--topology", "ring", "--iterations", 5, "--backup-workers", 1, "--max-ig", 2,
             "--skip", "max-jump=2,trigger=3"])
    line = str(err.value)
    assert "\n" not in line and line.startswith("--skip max-jump=2,trigger=3: never skips with --max-ig 2: ") and \
        line.endswith("use trigger <= 2"), line
    import json
    path = tmp_path / "directed.json"
    path.write_text(json.dumps({"directed": True, "nodes": [{"id": i} for i in range(6)],
                                "links": [{"source": i, "target": (i + 1) % 6} for i in range(6)]}))
    sim(["--topology", path, "--iterations", 80, "--staleness", 1, "--max-ig", 1, "--skip", "max-jump=2,trigger=2",
         "--slowdown", "rank=3,factor=6", "--log-dir", tmp_path / "logs"])
    assert _jumps(tmp_path / "logs", 3) >= 5           # (39 measured)


def test_backup_workers_every_node_of_the_file_overrides_are_refused(tmp_path):
    """A topology file whose every node sets ``backup_workers`` left ``--backup-workers`` unused (a node's own
    value wins), silently: the run was titled "backup" with none. Refused like any option the run ignores;
    a file where only some nodes set it still takes the option for the others."""
    import json
    links = [{"source": i, "target": (i + d) % 6} for i in range(6) for d in (1, 2, 4, 5)]
    path = tmp_path / "all.json"
    path.write_text(json.dumps({"directed": True, "links": links,
                                "nodes": [{"id": i, "backup_workers": 0} for i in range(6)]}))
    with pytest.raises(ConfigError) as err:
        sim(["--topology", path, "--iterations", 3, "--backup-workers", 1])
    assert str(err.value) == ("--backup-workers 1 is not used: every node of the topology file sets its own "
                              "backup_workers, which wins over the option (drop one of them)")
    assert sim(["--topology", path, "--iterations", 3])["setting"] == "standard"
    path.write_text(json.dumps({"directed": True, "links": links,
                                "nodes": [{"id": i, **({"backup_workers": 0} if i else {})} for i in range(6)]}))
    assert sim(["--topology", path, "--iterations", 3, "--backup-workers", 1])["setting"] == "backup"


def test_skipping_with_a_checkpoint_at_every_iteration_is_refused():
    """A jump never passes a checkpoint iteration (every worker must enter it); with ``--checkpoint-every 1``
    every iteration is one, so ``--skip`` did nothing, silently."""
    from hopdec.hop.config import check_config
    from hopdec.hop.worker import node_views
    from hopdec.topology import ring
    parsed = train_parse(["--topology", "ring", "--backup-workers", "1", "--skip", "max-jump=2,trigger=1",
                          "--checkpoint-dir", "ck", "--checkpoint-every", "1"])
    cfg = parsed.protocol.config(20, checkpoint_every=parsed.checkpoints.every)
    with pytest.raises(ConfigError, match="^--skip max-jump=2,trigger=1: never skips with --checkpoint-every 1: "):
        check_config(cfg, node_views(ring(4)))
    assert check_config(parsed.protocol.config(20, checkpoint_every=2), node_views(ring(4))) == []


def _train_and_sim(argv, n):
    """What ``hopdec train`` on n workers (PS: n + 1 ranks) and ``hopdec sim -n n`` say of ``argv``: "ok" or
    the one line each refuses it with (the command's name left out)."""
    import contextlib
    from hopdec.errors import HopdecError
    from hopdec.runtime.setup import setup
    from hopdec.sim.run import Simulation

    def said(fn):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                fn()
            return "ok"
        except HopdecError as err:
            return str(err)

    def train():
        s = train_parse(argv)
        setup(s, SizedComm(n + 1 if s.mode == "ps" else n))
    return said(train), said(lambda: Simulation(sim_parse(argv + ["-n", str(n)]), io.StringIO()))


@pytest.mark.parametrize("argv", [
    ["--backup-workers", "7", "--slowdown", "rank=99,factor=2"],
    ["--topology", "torus", "--slowdown", "rank=99,factor=2"],
    ["--staleness", "1", "--skip", "max-jump=9,trigger=1", "--slowdown", "rank=8,factor=2"],
])
def test_a_command_line_with_two_problems_gets_the_same_line_from_train_and_sim(argv):
    """One settings object, one assembly (issue 19): train checked --slowdown before the topology and the
    mechanisms, sim after them, so the same command line was refused for --slowdown by one and for
    --backup-workers by the other."""
    t, s = _train_and_sim(argv, 8 if "torus" not in argv else 7)
    assert t == s != "ok", (t, s)


def test_random_command_lines_are_accepted_or_refused_alike_by_train_and_sim():
    """Seeded random option combinations (valid and invalid values, several at once) through both
    commands' settings and assembly: the same verdict, the same line."""
    import random
    pool = {"--topology": ["ring", "exponential", "torus", "one-peer-exponential", "topologies/ring_8.json"],
            "--protocol": ["tokens", "queue-only", "notify-ack"], "--max-ig": ["0", "1", "3"],
            "--backup-workers": ["0", "1", "7"], "--staleness": ["0", "2"],
            "--skip": ["max-jump=3,trigger=2", "max-jump=2"], "--compress": ["fp16", "topk:2"],
            "--local-steps": ["0", "2"], "--slowdown": ["rank=3,factor=4", "rank=99,factor=2"],
            "--iterations": ["0", "5"], "--batch-size": ["0", "100000"], "--sync": ["ssp", "dssp", "elastic"],
            "--staleness-range": ["6,2"], "--mode": ["ps", "allreduce"], "--fault-tolerance": None,
            "--model": ["mlp", "svm"], "--lr": ["-1"]}
    rng = random.Random(19)
    for _ in range(40):
        argv = []
        for opt in rng.sample(sorted(pool), rng.randint(1, 4)):
            argv += [opt] if pool[opt] is None else [opt, rng.choice(pool[opt])]
        n = 8 if "topologies/ring_8.json" in argv else rng.choice([3, 4, 9])
        t, s = _train_and_sim(argv, n)
        assert t == s, (argv, n, t, s)
