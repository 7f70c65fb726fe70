"""``hopdec train`` option handling that needs no MPI job."""

import pytest

from hopdec.hop.config import parse_skip, setting_name
from hopdec.errors import ConfigError, HopdecError
from hopdec.hop.config import ProtocolConfig
from hopdec.cli.train import build_parser, parse
from hopdec.modes.decentralized import resolve_topology
from hopdec import topology as T
from hopdec.topology import default_topology


def test_topology_can_be_a_file_or_a_generator_kind():
    assert resolve_topology("topologies/ring_8.json", 8).number_of_nodes() == 8
    g = resolve_topology("double-ring", 8)
    assert g.number_of_nodes() == 8 and g.graph["source"] == "double-ring(8)"
    with pytest.raises(ConfigError, match="--topology ring-based: .*even"):
        resolve_topology("ring-based", 5)
    with pytest.raises(HopdecError, match="no-such-file.json: no such file"):
        resolve_topology("no-such-file.json", 4)


def test_a_mistyped_topology_names_what_was_meant(tmp_path, monkeypatch):
    """A newcomer's ``--topology rign`` or ``ring_8.json`` (the README's list names the files without their
    folder) says what is close: a generator kind, a shipped file -- from any working directory -- or a file
    beside the one given; a name close to nothing gets no guess, and a path no list of kinds (it is the file
    reader's own line, as ``hopdec topo analyze`` says it)."""
    import os
    from hopdec.topology.graph_io import SHIPPED
    monkeypatch.chdir(tmp_path)
    said = {}
    for spec in ["rign", "ring_8.json", "torus16.json", "mine.jsn", "zzzz", "zz/zz.json"]:
        with pytest.raises(HopdecError) as err:
            resolve_topology(spec, 8)
        said[spec] = str(err.value)
    (tmp_path / "mine.json").write_text("0 1\n1 0\n")
    with pytest.raises(HopdecError) as err:
        resolve_topology("mine.jsn", 2)
    nofile = "no such file (expected a topology file)"
    assert str(err.value) == f"mine.jsn: {nofile}; did you mean mine.json?"
    assert said["rign"] == ("--topology rign: no such file, and not a generator kind (one of complete, double-ring, "
                            "exponential, hierarchical-a, hierarchical-b, one-peer-exponential, ring, ring-based, "
                            "torus); did you mean ring?")
    assert said["ring_8.json"] == f"ring_8.json: {nofile}; did you mean {SHIPPED}{os.sep}ring_8.json?"
    assert said["torus16.json"].endswith(f"; did you mean {SHIPPED}{os.sep}torus_16.json?")
    assert said["mine.jsn"] == f"mine.jsn: {nofile}"
    assert "did you mean" not in said["zzzz"] and "generator kind" in said["zzzz"]
    assert said["zz/zz.json"] == f"zz/zz.json: {nofile}"
    monkeypatch.chdir(os.path.dirname(SHIPPED))         # from the checkout: the path as typed there
    with pytest.raises(HopdecError, match=r"^ring_8.json: no such file \(expected a topology file\); "
                                          r"did you mean topologies/ring_8.json\?$"):
        T.load("ring_8.json")


def test_default_topology_fits_any_size():
    for n, kind in [(1, "complete"), (2, "complete"), (3, "ring"), (6, "ring-based")]:
        g = default_topology(n)
        assert g.number_of_nodes() == n and g.graph["source"].startswith(kind)


def test_skip_spec():
    assert parse_skip("max-jump=10,trigger=3") == (10, 3)
    assert parse_skip("max-jump=2") == (2, 2)
    assert parse_skip(None) == (0, 2)
    for bad in ["trigger=2", "max-jump=x", "jump=3"]:
        with pytest.raises(ConfigError, match="--skip"):
            parse_skip(bad)


def test_setting_names_match_table_1_rows():
    def name(**kw):
        return setting_name(ProtocolConfig(iterations=1, **kw))
    assert name() == "standard"
    assert name(backup_workers=1) == "backup"
    assert name(staleness=2) == "staleness"
    assert name(staleness=2, backup_workers=1) == "hybrid"
    assert name(protocol="notify-ack") == "notify-ack"


def test_parser_has_ps_options_and_paper_defaults():
    args = build_parser().parse_args(["--mode", "ps", "--sync", "ssp", "--staleness", "3"])
    assert args.mode == "ps" and args.sync == "ssp" and args.staleness == 3
    args = build_parser().parse_args([])
    assert args.protocol == "tokens" and args.compute_graph == "parallel" and args.dataset == "digits"


def test_sync_implies_ps_and_is_not_ignored():
    assert parse(["--sync", "ssp"]).mode == "ps"
    args = parse([])
    assert args.mode == "decentralized" and args.ps.sync is None and args.protocol.backup_workers is None
    assert parse(["--sync", "asp"]).replace().mode == "ps"      # idempotent
    with pytest.raises(ConfigError, match="--sync ssp is a parameter-server option"):
        parse(["--mode", "decentralized", "--sync", "ssp"])


def test_bad_options_are_one_line_not_a_usage_block():
    with pytest.raises(ConfigError, match=r"^argument --max-ig: invalid int value: 'x' \(see hopdec train --help\)$"):
        build_parser().parse_args(["--max-ig", "x"])


def test_ps_backup_defaults_to_one_backup_worker():
    args = parse(["--sync", "backup"])
    assert args.ps.policy(range(1, 5)).settings() == {"backup_workers": 1, "N": 3}


def test_a_slowdown_on_the_parameter_server_rank_is_refused():
    from hopdec.heterogeneity import Emulator
    with pytest.raises(ConfigError, match="rank 0 is not a worker: the workers are ranks 1..4 "
                                          r"\(rank 0 is the parameter server\)"):
        Emulator("rank=0,factor=2", 1, range(1, 5))


def test_without_mpirun_it_says_how_to_start_several_workers(tmp_path):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
    out = subprocess.run([sys.executable, "-m", "hopdec.cli", "train", "--iterations", "2", "--no-progress",
                          "--consensus-every", "1"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "note: running 1 worker; start N workers with `mpirun -n N hopdec train" in out.stderr
    # (and rank 0 names an option whose results go nowhere, once)
    assert out.stderr.count("hopdec train: note: --consensus-every 1: the rounds go to --log-dir") == 1, out.stderr


def test_help_texts_read_as_plain_text_and_name_every_mode_of_eval_interval(capsys):
    """What a user reads in --help: no reST markup (``...``) in a description, and --eval-interval says
    what it evaluates in each mode that takes it (--mode allreduce evaluates too)."""
    import subprocess
    import sys
    from hopdec.cli import sim, train
    train_help = " ".join(train.build_parser().format_help().split())
    i = train_help.index("--eval-interval SECONDS ")
    eval_help = train_help[i:i + 700]
    for mode in ("--mode ps", "--mode allreduce", "decentralized"):
        assert mode in eval_help, mode
    assert "``" not in sim.build_parser().format_help()
    out = subprocess.run([sys.executable, "-m", "hopdec.testbed", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "hopdec.testbed" in out.stdout and "``" not in out.stdout


def test_python_dash_m_hopdec_is_the_command_and_version_is_the_packages(tmp_path, capsys):
    """``python -m hopdec`` said "'hopdec' is a package and cannot be directly executed" (a machine without
    the ``hopdec`` script on PATH); ``hopdec --version`` was "unknown command". The version has one source:
    setup.cfg reads ``hopdec.__version__``."""
    import subprocess
    import sys
    from importlib.metadata import version

    import hopdec
    out = subprocess.run([sys.executable, "-m", "hopdec", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == f"hopdec {hopdec.__version__}\n" and not out.stderr
    assert version("hopdec") == hopdec.__version__
    out = subprocess.run([sys.executable, "-m", "hopdec", "topo", "generate", "ring", "-n", "3", "-o", tmp_path / "r.json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and (tmp_path / "r.json").exists(), out.stderr
    out = subprocess.run([sys.executable, "-m", "hopdec", "nosuch"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown command 'nosuch'" in out.stderr and "did you mean" not in out.stderr
    from hopdec.cli.main import main
    assert main(["trian"]) == 2
    assert capsys.readouterr().err == ("hopdec: unknown command 'trian' (expected topo, train, sim, report, plot or "
                                       "trace); did you mean train?\n")


@pytest.mark.parametrize("argv, says", [
    (["train", "--topolgy", "ring"], "hopdec train: error: unrecognized arguments: --topolgy ring; did you mean "
                                     "--topology? (see hopdec train --help)"),
    (["sim", "--iteratons=3"], "hopdec sim: error: unrecognized arguments: --iteratons=3; did you mean --iterations? "
                               "(see hopdec sim --help)"),
    (["topo", "analyze", "topologies/ring_8.json", "--max-gi", "3"],
     "hopdec topo: error: unrecognized arguments: --max-gi 3; did you mean --max-ig? (see hopdec topo -h)"),
    (["report", "x", "--outptu", "y"], "hopdec report: error: unrecognized arguments: --outptu y; did you mean "
                                       "--output? (see hopdec report --help)"),
    (["sim", "--zzz"], "hopdec sim: error: unrecognized arguments: --zzz (see hopdec sim --help)"),
    # a hidden option (train's fault injection) is never suggested: --deaths (hopdec sim's) said --die-at
    (["train", "--deaths", "1@1"], "hopdec train: error: unrecognized arguments: --deaths 1@1 (see hopdec train --help)"),
    # a mistyped choice: the close one, or every choice it begins (argparse's "invalid choice" alone before)
    (["sim", "--mode", "decentralised"], "hopdec sim: error: argument --mode: invalid choice: 'decentralised' "
     "(choose from 'decentralized', 'ps', 'allreduce'); did you mean decentralized? (see hopdec sim --help)"),
    (["topo", "generate", "hierarchical", "-n", "8", "-o", "never.json"],
     "hopdec topo: error: argument kind: invalid choice: 'hierarchical' (choose from 'complete', 'double-ring', "
     "'exponential', 'hierarchical-a', 'hierarchical-b', 'one-peer-exponential', 'ring', 'ring-based', 'torus'); "
     "did you mean hierarchical-a or hierarchical-b? (see hopdec topo generate -h)"),
    (["sim", "--mode", "ps", "-n", "3", "--sync", "bsp2"], "hopdec sim: error: --sync must be one of bsp, asp, ssp, "
     "dssp, elastic, backup, esync, got 'bsp2'; did you mean bsp?"),
    # only train's workers come from a launcher: another command without -n says nothing more
    (["report", "x", "-n", "3"], "hopdec report: error: unrecognized arguments: -n 3 (see hopdec report --help)"),
    # `launch/local.sh --fault-tolerance -n 4`: the launcher takes -n only first, so train got it
    (["train", "--iterations", "9", "-n", "4"], "hopdec train: error: unrecognized arguments: -n 4; the number of "
     "workers is the launcher's: launch/local.sh -n N [train args...] (-n first), or mpirun -n N hopdec train ... "
     "(see hopdec train --help)"),
])
def test_a_mistyped_option_names_the_option_meant(argv, says, capsys, monkeypatch):
    """Python 3.11's argparse says only "unrecognized arguments"; every hopdec command (one parser class)
    adds the close option, also one of a subcommand's (``topo analyze``), and nothing when none is close."""
    import os
    from hopdec.cli.main import main
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert main(argv) == 2
    assert capsys.readouterr().err == says + "\n"


@pytest.mark.parametrize("argv, says", [
    (["sim", "--mode", "ps", "-n", "3", "--sync", "dssp", "--staleness-range", "-1,3"],
     "hopdec sim: error: --staleness-range must be >= 0, got -1,3"),
    (["sim", "-n", "3", "--slowdown", "-2"], "hopdec sim: error: --slowdown '-2': '-2' is not key=value"),
    # an option's name where its value should be is still "expected one argument", never taken as the value
    (["sim", "-n", "3", "--log-dir", "--overwrite"],
     "hopdec sim: error: argument --log-dir: expected one argument (see hopdec sim --help)"),
])
def test_a_value_that_starts_with_a_minus_sign_reaches_the_options_check(argv, says, capsys, monkeypatch):
    """``--staleness-range -1,3`` said "argument --staleness-range: expected one argument" (argparse takes
    any "-1,3" that is not a plain number for an option): a value starting with a minus and a digit is the
    option's value, which then gets the option's own one line."""
    import os
    from hopdec.cli.main import main
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == says
    assert parse(["--mode", "ps", "--sync", "dssp", "--staleness-range", "-1,3"]).ps.staleness_range == "-1,3"
