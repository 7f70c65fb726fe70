"""``hopdec topo`` end to end, through ``python -m hopdec.cli`` as a user runs it."""

import contextlib
import io
import json
import math
import os
import subprocess
import sys

import pytest

from hopdec import topology as T
from hopdec.errors import TopologyError
from conftest import ROOT
# every bad file of the library tests, each checked again through the CLI (one line, exit 2)
from bad_topologies import BAD_FILES, UNTRAINABLE  # noqa: E402


def topo_process(*args, cwd=None):
    """``python -m hopdec.cli topo ARGS`` in a new process, exactly as a user runs it."""
    return subprocess.run([sys.executable, "-m", "hopdec.cli", "topo", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def topo(*args, cwd=None):
    """The same command in this process (``hopdec.cli.main.main``, what the entry point calls), with its
    stdout, stderr and exit code: no second of interpreter start-up per check. ``cwd``: run from there."""
    from hopdec.cli.main import main
    argv = ["topo", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:                 # argparse's exits
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess(argv, rc or 0, out.getvalue(), err.getvalue())


def ring_gap(n):
    return 1 - max(abs(1 + 2 * math.cos(2 * math.pi * k / n)) / 3 for k in range(1, n))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("topo")
    out = {}
    for kind, n, name in (("ring", 8, "r8"), ("hierarchical-a", 8, "ha"),
                          ("exponential", 16, "e16")):
        path = d / f"{name}.json"
        r = topo_process("generate", kind, "-n", n, "-o", path)
        assert r.returncode == 0, r.stderr
        assert path.name in r.stdout and f"{n} nodes" in r.stdout
        out[name] = path
    return out


def test_generate_writes_loadable_graph(files):
    G = T.load(files["ha"])
    assert G.number_of_nodes() == 8
    assert [G.nodes[i]["machine"] for i in (0, 4, 6)] == ["m0", "m1", "m2"]
    assert sorted(G.edges) == sorted(T.hierarchical((4, 2, 2), "a").edges)


def test_generate_hierarchical_with_machines(tmp_path):
    path = tmp_path / "h.json"
    r = topo("generate", "hierarchical-b", "--machines", "3,3,2", "-o", path)
    assert r.returncode == 0, r.stderr
    G = T.load(path)
    assert [G.nodes[i]["machine"] for i in range(8)] == ["m0"] * 3 + ["m1"] * 3 + ["m2"] * 2
    assert G.has_edge(2, 3) and G.has_edge(5, 6) and G.has_edge(7, 0)


def test_analyze_human(files):
    r = topo("analyze", files["r8"], "--staleness", "1", "--max-ig", "3")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert str(files["r8"]) in out
    assert "16 (directed, self-loops not counted)" in out
    assert f"{ring_gap(8):.4f}" in out
    lines = {ln.split("  ")[1].strip(): ln for ln in out.splitlines() if ln.startswith("  ")
             and "  " in ln[2:]}
    assert lines["standard (update queues)"].split()[3] == "4"         # diameter of ring 8
    assert lines["bounded staleness s=1"].split()[3] == "8"            # (s+1) * 4
    assert lines["backup / hybrid"].split()[3] == "inf"
    assert lines["backup / hybrid + token queues"].split()[6] == "12"  # 3 * 4
    assert "largest update queue  12" in out                          # (1+3) * 3
    assert "largest token queue   6" in out                            # 3 * (1 + 1)
    assert "row i, column j" in out                                    # n <= 8: pair matrix
    assert r.stderr == ""                                              # doubly stochastic


def test_analyze_no_pair_matrix_for_large_graphs(files):
    r = topo("analyze", files["e16"])
    assert r.returncode == 0 and "row i, column j" not in r.stdout
    assert "max_ig=2" in r.stdout                                      # the default, shown


def test_analyze_json(files):
    r = topo("analyze", files["r8"], "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    for key in ("nodes", "edges", "strongly_connected", "doubly_stochastic", "spectral_gap",
                "diameter", "gap_bounds", "max_ig", "staleness", "update_queue_capacity",
                "token_queue_capacity"):
        assert key in s
    assert (s["nodes"], s["edges"], s["diameter"]) == (8, 16, 4)
    assert s["strongly_connected"] is True and s["doubly_stochastic"] is True
    assert s["spectral_gap"] == pytest.approx(ring_gap(8), abs=1e-9)
    assert s["max_ig"] == 2 and s["staleness"] is None
    assert s["gap_bounds"]["standard"] == 4 and s["gap_bounds"]["backup"] == "inf"
    assert s["gap_bounds"]["backup+tokens"] == 8 and s["gap_bounds"]["notify-ack"] == 4
    assert "staleness" not in s["gap_bounds"]
    assert s["update_queue_capacity"] == 9 and s["token_queue_capacity"] == 4


def test_analyze_json_directed_with_staleness(files):
    r = topo("analyze", files["e16"], "--json", "--staleness", "2", "--max-ig", "1")
    s = json.loads(r.stdout)
    G = T.load(files["e16"])
    assert s["staleness"] == 2 and s["max_ig"] == 1
    assert s["gap_bounds"]["staleness"] == T.max_gap_bound(G, "staleness", staleness=2) == 12
    assert s["gap_bounds"]["staleness+tokens"] == T.max_gap_bound(
        G, "staleness", max_ig=1, staleness=2)
    assert s["gap_bounds"]["standard+tokens"] == T.max_gap_bound(G, max_ig=1)
    assert s["spectral_gap"] == pytest.approx(T.spectral_gap(G))


def test_analyze_warns_when_not_doubly_stochastic(files):
    r = topo("analyze", files["ha"], "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout)["doubly_stochastic"] is False
    assert "warning" in r.stderr and "doubly-stochastic" in r.stderr
    assert str(files["ha"]) in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_analyze_plot(files, tmp_path):
    png = tmp_path / "out.png"
    r = topo("analyze", files["ha"], "--plot", png)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    assert f"wrote {png}" in r.stderr                   # it wrote it silently; plot and report say so
    r = topo("analyze", files["ha"], "--json", "--plot", png)
    assert json.loads(r.stdout)["nodes"] == 8 and f"wrote {png}" in r.stderr      # stdout stays JSON


def test_compare(files):
    r = topo("compare", files["r8"], files["e16"])
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith(str(files["r8"].parent))]
    assert len(rows) == 2
    r8 = rows[0].split()
    assert r8[0] == str(files["r8"]) and r8[1:3] == ["8", "16"]
    assert f"{ring_gap(8):.4f}" in r8
    assert rows[1].split()[1:3] == ["16", "64"]
    r = topo("compare", files["r8"], files["e16"], "--json")
    data = json.loads(r.stdout)
    assert [d["nodes"] for d in data] == [8, 16]
    assert data[1]["diameter"] == 4 and data[1]["gap_bounds"]["standard+tokens"] == 3


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_one_line_error(tmp_path, name):
    path = tmp_path / name
    path.write_text(BAD_FILES[name][0])
    r = topo("analyze", path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and BAD_FILES[name][1] in lines[0]


def test_missing_file_and_compare_with_a_bad_file(tmp_path, files):
    r = topo("analyze", tmp_path / "absent.json")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "absent.json" in r.stderr
    r = topo("compare", files["r8"], tmp_path / "absent2.txt")
    assert r.returncode != 0 and "absent2.txt" in r.stderr and "Traceback" not in r.stderr
    # a good file with a note of its own (not doubly stochastic) before the bad one: the bad one's line is all
    (tmp_path / "directed.txt").write_text("0 1\n1 2\n2 0\n0 2\n")
    r = topo("compare", tmp_path / "directed.txt", tmp_path / "absent3.txt")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()] and "absent3.txt" in r.stderr


def test_compare_refusing_a_later_file_prints_only_the_refusal(tmp_path):
    """The first file is fine but draws a warning (column- but not doubly-stochastic W); the second is
    refused. The refusal is the one line on stderr: the first file's warning came before it (a warning
    and an error for one refused command, from a seeded fuzz of hopdec topo)."""
    warned = tmp_path / "directed.txt"
    warned.write_text("0 1\n1 2\n2 0\n0 2\n")
    assert "warning" in topo("compare", warned).stderr
    r = topo("compare", warned, tmp_path / "absent.txt")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "absent.txt" in r.stderr, r.stderr
    other = tmp_path / "ring.txt"
    other.write_text("0 1\n1 0\n1 2\n2 1\n2 3\n3 2\n3 0\n0 3\n")
    r = topo("compare", warned, other, "--machines", "1,1,1")       # sizes fit the first file, not the second
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "ring.txt" in r.stderr, r.stderr


@pytest.mark.parametrize("args,problem", [
    (["generate", "torus", "-n", "7", "-o", "x.json"], "torus"),
    (["generate", "ring", "-o", "x.json"], "-n is required"),
    (["generate", "hexagon", "-n", "6", "-o", "x.json"], "invalid choice"),
    (["generate", "hierarchical-a", "-n", "9", "--machines", "4,2,2", "-o", "x.json"], "add up"),
    (["analyze", "whatever.json", "--max-ig", "0"], "--max-ig"),
])
def test_bad_options_one_line(tmp_path, args, problem):
    r = topo(*args, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0]
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("name", sorted(UNTRAINABLE))
def test_analyze_reports_graphs_that_are_not_strongly_connected(tmp_path, name):
    path = tmp_path / name
    path.write_text(UNTRAINABLE[name][0])
    r = topo("analyze", path)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "strongly connected" in ln)
    assert line.split()[2] == "no:" and "{0" in line
    assert "diameter              inf" in r.stdout
    warn = [ln for ln in r.stderr.splitlines() if "not strongly connected" in ln]
    assert len(warn) == 1 and "hopdec train refuses it" in warn[0] and name in warn[0]
    s = json.loads(topo("analyze", path, "--json").stdout)
    assert s["strongly_connected"] is False and len(s["components"]) >= 2
    assert sorted(v for c in s["components"] for v in c) == list(range(s["nodes"]))
    assert s["gap_bounds"]["standard"] == "inf" and s["diameter"] == "inf"


def test_analyze_lists_components():
    from hopdec.cli.topo import _components
    assert _components([[0], [1, 2]]) == "{0}, {1, 2}"
    assert _components([list(range(10))], members=3) == "{0, 1, 2, ... (10 nodes)}"
    assert _components([[i] for i in range(8)], shown=2) == "{0}, {1}, ... (8 components)"


def _train_setup_stderr(path, ranks, capsys):
    """What ``hopdec train --topology PATH`` prints on rank 0 of ``ranks`` while it sets up (no MPI)."""
    from hopdec.cli.train import parse
    from hopdec.runtime.setup import setup

    class Comm:
        def Get_size(self):
            return ranks

        def Get_rank(self):
            return 0
    capsys.readouterr()
    setup(parse(["--topology", str(path), "--iterations", "1", "--threads", "1"]), Comm())
    return capsys.readouterr().err


def test_weight_warnings_are_the_same_for_analyze_and_train(tmp_path, capsys):
    """One weight rule: analyze and train print the same notes about a file's weights."""
    path = tmp_path / "w.txt"
    path.write_text("0 1 2\n1 0 2\n0 0 2\n1 1 6\n1 2 1\n2 1 0\n2 0 1\n0 2 1\n")
    r = topo("analyze", path)
    assert r.returncode == 0, r.stderr
    from_analyze = sorted(ln.split("warning: ", 1)[1] for ln in r.stderr.splitlines()
                          if "do not sum to 1" in ln or "weight 0" in ln)
    assert len(from_analyze) == 2 and "in-weights renormalised" in r.stdout

    err = _train_setup_stderr(path, 3, capsys)
    from_train = sorted(ln.split("warning: ", 1)[1] for ln in err.splitlines() if "warning" in ln)
    assert from_train == from_analyze and all(ln.startswith("hopdec train: warning") for ln in
                                              err.strip().splitlines())


@pytest.mark.parametrize("self_weight, periodic", [(0.0, True), (0.5, False)])
def test_a_periodic_w_is_named_by_train_and_sim(tmp_path, capsys, self_weight, periodic):
    """A directed 4-cycle whose workers keep no self-weight passes the models round (W periodic: they never
    approach their average): analyze warned, train and sim said nothing. One worker keeping a positive
    self-weight makes W aperiodic: no warning."""
    import io

    from hopdec.cli.sim import parse as sim_parse
    from hopdec.sim.run import simulate
    path = tmp_path / "cycle.txt"
    path.write_text(f"0 0 {self_weight}\n" + "".join(f"{i} {(i + 1) % 4} 1\n{i + 1} {i + 1} 0\n" for i in range(3))
                    + "3 0 1\n")

    train = [ln for ln in _train_setup_stderr(path, 4, capsys).splitlines() if "W is periodic" in ln]
    simulate(sim_parse(["--topology", str(path), "--iterations", "3", "--no-progress"]), out=io.StringIO())
    sim = [ln for ln in capsys.readouterr().err.splitlines() if "W is periodic" in ln]
    if periodic:
        assert len(train) == 1 and train[0].startswith(f"hopdec train: warning: {path}: W is periodic"), train
        assert sim == [train[0].replace("hopdec train:", "hopdec sim:")], sim
    else:
        assert train == [] and sim == []
    r = topo("analyze", path)
    assert ("W is periodic" in r.stderr) == periodic, r.stderr


def test_byte_order_mark_json(tmp_path, files):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + files["r8"].read_bytes())
    r = topo("analyze", path, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["nodes"] == 8


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_fifo_or_device_is_refused_without_reading(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "pipe.json"
        os.mkfifo(path)                 # nobody writes: opening it would block forever
    else:
        path = "/dev/zero"              # reading it would never end
    r = topo("analyze", path)           # topo()'s timeout fails the test instead of hanging
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "not a regular file" in lines[0]


def test_oversized_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("hopdec.topology.graph_io.MAX_FILE_BYTES", 100)
    path = tmp_path / "big.txt"
    path.write_text("0 1\n1 0\n" * 20)
    with pytest.raises(TopologyError, match="big.txt: 160 bytes, more than a topology file may have "
                                            r"\(100 bytes\)"):
        T.load(path)


def test_generate_metropolis_weights(tmp_path):
    path = tmp_path / "hm.json"
    r = topo("generate", "hierarchical-a", "-n", "8", "--weights", "metropolis", "-o", path)
    assert r.returncode == 0 and "Metropolis-Hastings weights" in r.stdout
    r = topo("analyze", path, "--json")
    s = json.loads(r.stdout)
    assert s["doubly_stochastic"] is True and r.stderr == ""
    assert s["spectral_gap"] == pytest.approx(s["metropolis_spectral_gap"])
    r = topo("generate", "exponential", "-n", "8", "--weights", "metropolis", "-o", tmp_path / "x.json")
    assert r.returncode == 2 and "symmetric" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()


def test_analyze_reports_metropolis_gap_of_the_hierarchical_example(files):
    s = json.loads(topo("analyze", files["ha"], "--json").stdout)
    assert s["metropolis_spectral_gap"] == pytest.approx(
        T.spectral_gap(T.metropolis_weights(T.hierarchical((4, 2, 2), "a"))))
    assert json.loads(topo("analyze", files["e16"], "--json").stdout)["metropolis_spectral_gap"] is None


def test_analyze_skips_all_pairs_figures_beyond_a_size(files, monkeypatch, capsys):
    from hopdec.cli.topo import main
    monkeypatch.setattr("hopdec.topology.analysis.ALL_PAIRS_MAX_N", 10)
    assert main(["analyze", str(files["e16"])]) == 0
    out = capsys.readouterr().out
    assert "skipped: diameter, gap_bounds, update_queue_capacity_no_tokens, token_queue_capacity: " \
           "all-pairs path lengths are computed up to 10 nodes" in out
    assert "diameter              -" in out and "largest token queue   -" in out
    assert "spectral gap" in out and "largest update queue  15" in out   # the cheap figures stay
    assert main(["analyze", str(files["e16"]), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["diameter"] is None and s["gap_bounds"] is None and "10 nodes" in s["skipped"]


def test_plot_refuses_large_graphs(tmp_path, monkeypatch):
    from hopdec.cli.topo import main
    from hopdec.errors import ConfigError
    monkeypatch.setattr("hopdec.cli.topo.PLOT_MAX_N", 10)
    path = tmp_path / "e16.json"
    T.save(T.exponential(16), path)
    with pytest.raises(ConfigError, match="--plot: draws graphs of up to 10 nodes, .*e16.json has 16"):
        main(["analyze", str(path), "--plot", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


def test_plot_writes_the_format_its_name_says_and_refuses_what_it_cannot(tmp_path, capsys):
    """``--plot out.pdf`` wrote PNG bytes into out.pdf, ``--plot ''`` drew nothing without a word, and a name
    matplotlib cannot write was found after the analysis; now they are as ``hopdec plot -o``: the suffix's
    format, ``.png`` added to a bare name, one line before any work otherwise."""
    from hopdec.cli.topo import main
    from hopdec.errors import ConfigError
    path = tmp_path / "r8.json"
    T.save(T.ring(8), path)
    for name, magic in (("g.pdf", b"%PDF"), ("g.svg", b"<?xml"), ("g.png", b"\x89PNG")):
        assert main(["analyze", str(path), "--plot", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_bytes().startswith(magic), name
    assert main(["analyze", str(path), "--plot", str(tmp_path / "bare")]) == 0
    assert (tmp_path / "bare.png").read_bytes().startswith(b"\x89PNG")
    capsys.readouterr()
    for out, says in (("", "analyze --plot '': an empty output path"),
                      (str(tmp_path / "g.txt"), f"analyze --plot {tmp_path / 'g.txt'}: matplotlib cannot write .txt "
                                                "files (png, pdf, svg, ... can)"),
                      (str(tmp_path / "no" / "g.png"), f"analyze --plot {tmp_path / 'no' / 'g.png'}: folder "
                                                       f"{tmp_path / 'no'} does not exist")):
        with pytest.raises(ConfigError) as err:
            main(["analyze", str(path), "--plot", out])
        assert str(err.value) == says
        assert capsys.readouterr().out == ""        # (refused before the analysis printed anything)


def test_generate_checks_its_output_before_any_work(tmp_path):
    """``-o ''`` said "generate: cannot write : No such file or directory" after building the graph; the output
    is checked first, as report's and plot's -o are."""
    for out, says in (("", "generate -o '': an empty output path"),
                      (str(tmp_path / "no" / "g.json"), f"generate -o {tmp_path / 'no' / 'g.json'}: folder "
                                                        f"{tmp_path / 'no'} does not exist")):
        r = topo("generate", "ring", "-n", 8, "-o", out)
        assert r.returncode == 2 and r.stderr == f"hopdec topo: error: {says}\n" and r.stdout == "", r.stderr


def test_a_misspelt_attribute_is_named_not_silently_ignored(tmp_path):
    """A node-link file whose edges say "wieght" and nodes "machin" was analysed (and trained on) as an
    unweighted graph on no machines, without a word. Attributes spelt like hopdec's get a warning naming the
    one meant; a file's own attributes (a label, a position) pass silently."""
    data = json.loads(open(os.path.join(ROOT, "topologies", "hierarchical_a_8.json")).read())
    for n in data["nodes"]:
        n["machin"], n["label"] = n.pop("machine"), "x"
    for e in data["edges"]:
        e["wieght"], e["latnecy"], e["pos"] = e.pop("weight"), 0.001, [0, 1]
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(data))
    r = topo("analyze", path)
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "is not one hopdec reads" in ln]
    assert said == [f"hopdec topo: warning: {path}: {what} attribute {k!r} is not one hopdec reads, so it is "
                    f"ignored; did you mean {meant}?" for what, k, meant in
                    (("node", "machin", "machine"), ("edge", "latnecy", "latency"), ("edge", "wieght", "weight"))]
    assert "label" not in r.stderr and "'pos'" not in r.stderr
    r = topo("analyze", os.path.join(ROOT, "topologies", "hierarchical_a_8.json"))
    assert "is not one hopdec reads" not in r.stderr


def test_analyze_warns_when_averaging_never_converges(tmp_path):
    """A directed ring whose workers give themselves weight 0 is strongly connected and doubly stochastic,
    and was analysed without a word: W is a permutation (spectral gap 0), the models only travel round the
    ring and never approach their average."""
    import networkx as nx
    g = nx.DiGraph()
    for i in range(4):
        g.add_edge(i, i, weight=0.0)
        g.add_edge(i, (i + 1) % 4, weight=1.0)
    path = tmp_path / "periodic.json"
    path.write_text(json.dumps(nx.node_link_data(g, edges="edges")))
    r = topo("analyze", path)
    assert r.returncode == 0 and "spectral gap 0" in r.stderr and "never" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    ring = tmp_path / "ring.json"
    ring.write_text(json.dumps(nx.node_link_data(T.ring(4), edges="edges")))
    assert topo("analyze", ring).stderr == ""


def test_message_mb_help_says_mib_as_the_values_are_read():
    """``--message-mb`` counts MiB (2^20 bytes) in hopdec sim and in topo analyze/compare, but their help
    showed the metavar ``MB`` (10^6 bytes, 4.9% less): now ``MIB`` in every help, and 1 is 2^20 bytes."""
    import argparse
    from hopdec.cli import sim
    from hopdec.cli.topo import build_parser
    from hopdec.sim.network import LinkModel
    from hopdec.topology.traffic import traffic
    parsers = [sim.build_parser()]
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    parsers += [sub.choices["analyze"], sub.choices["compare"]]
    for p in parsers:
        text = " ".join(p.format_help().split())
        assert "--message-mb MIB" in text and "--message-mb MB" not in text, p.prog
        assert "MiB" in text, p.prog
    import networkx as nx
    t = traffic(nx.DiGraph([(0, 1)]), LinkModel(bandwidth=2 ** 20, latency=0), message_mb=1.0)
    assert t["seconds_per_iteration"] == 1.0       # 1 MiB at 1 MiB/s: one second


@pytest.mark.parametrize("cmd", ["topo", "report"])
def test_ctrl_c_on_a_long_command_is_one_line(cmd, monkeypatch, capsys):
    """Ctrl-C on ``hopdec topo generate`` of 100,000 workers (~20 s) or a long analyze printed a
    KeyboardInterrupt traceback; every command now says it stopped, in one line, and exits 130."""
    import importlib
    from hopdec.cli.main import main

    def interrupted(argv):
        raise KeyboardInterrupt
    if cmd == "topo":
        monkeypatch.setattr(importlib.import_module("hopdec.cli.topo"), "main", interrupted)
    else:
        monkeypatch.setattr(importlib.import_module("hopdec.cli.report"), "report_main", interrupted)
    try:
        rc = main([cmd, "whatever"])
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt escaped: a traceback")
    assert rc == 130
    assert capsys.readouterr().err == f"hopdec {cmd}: stopped by SIGINT\n"


@pytest.mark.parametrize("args,bad", [(["analyze", "--max-ig", "100000000000"], "--max-ig"),
                                      (["compare", "--max-ig", "1000001"], "--max-ig"),
                                      (["analyze", "--staleness", "10000000000"], "--staleness")])
def test_analyze_and_compare_bound_what_train_and_sim_bound(args, bad):
    """``topo analyze --max-ig 100000000000`` printed a table of queue sizes no run can have, where
    ``hopdec train`` and ``sim`` refuse any --max-ig above 10^6 and --staleness above 10^9: the same bounds
    now, one line naming the option."""
    r = topo(args[0], "topologies/ring_based_8.json", *args[1:])
    assert r.returncode == 2 and r.stdout == "", r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"argument {bad}: expected a " in lines[0] and "up to " in lines[0], r.stderr
    ok = topo(args[0], "topologies/ring_based_8.json", args[1], "1000000" if bad == "--max-ig" else "1000000000")
    assert ok.returncode == 0, ok.stderr


def test_generate_counts_one_node_and_one_edge_in_the_singular(tmp_path):
    """'ring, 1 nodes, 0 edges' read as a typo of the tool's; counts of one are singular."""
    r = topo("generate", "ring", "-n", "1", "-o", tmp_path / "one.json")
    assert r.returncode == 0 and ": ring, 1 node, 0 edges (self-loops not counted)" in r.stdout, r.stdout
    r = topo("generate", "ring", "-n", "2", "-o", tmp_path / "two.json")
    assert r.returncode == 0 and ": ring, 2 nodes, 2 edges (self-loops not counted)" in r.stdout, r.stdout
