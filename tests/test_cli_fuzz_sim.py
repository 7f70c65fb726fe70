"""``hopdec sim`` on option combinations nobody hand-picked: seeded random command lines drawn from the
options ``--help`` lists, valid, borderline and invalid values, generated and hostile topology files.

Each one either runs -- a summary whose rows count what was asked (``ceil(K/H)`` rounds of ``--local-steps
H``) and whose largest gap is within the printed bound -- or is refused with exactly one line naming what
is wrong, exit 2. Never a traceback, another exit code or a second line. (A 2026-12-03 run of 270 such
command lines found no defect; the summary's columns now name rounds, which it had flagged. A second run
of 500 found the send model's options taken and ignored outside decentralized mode.) ``hopdec topo analyze``
and ``compare`` on the same files: a result, or one error line and no warnings before it.
"""

import json
import math
import os
import random
import re

import pytest

from hopdec.cli.sim import main

CASES = int(os.environ.get("HOPDEC_FUZZ_CASES", 60))
"""Command lines per run (``HOPDEC_FUZZ_CASES=1000`` for a longer search; seeds 0..CASES-1)."""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("topologies")
    rng = random.Random(5)
    edges = {(i, (i + 1) % 6) for i in range(6)}          # a random strongly connected directed graph
    edges |= {(i, j) for i in range(6) for j in range(6) if i != j and rng.random() < 0.25}
    written = {
        "directed6.txt": "".join(f"{a} {b}\n" for a, b in sorted(edges)),
        "ring4.txt": "# a ring\n0 1\n1 2\n2 3\n3 0\n",
        "empty.json": "",
        "disconnected.txt": "0 1\n1 0\n2 3\n3 2\n",
        "duplicate.txt": "0 1\n0 1\n1 0\n",
        "warned.txt": "0 1\n1 2\n2 0\n0 2\n",        # W column- but not doubly stochastic: a warning
        "selfloop.txt": "0 0\n0 1\n1 0\n",
        "weights.json": json.dumps({"directed": True, "multigraph": False, "graph": {},
                                    "nodes": [{"id": i} for i in range(3)],
                                    "links": [{"source": a, "target": b, "weight": w}
                                              for (a, b), w in zip([(0, 1), (1, 2), (2, 0)], [1, -1, "x"])]}),
    }
    for name, text in written.items():
        (d / name).write_text(text)
    (d / "binary.json").write_bytes(bytes(range(256)) * 4)
    return {name: str(d / name) for name in list(written) + ["binary.json"]}


def command_line(rng, files):
    """One command line; a third of them hostile (an invalid value here and there, hostile files)."""
    hostile = rng.random() < 1 / 3
    maybe = lambda p: rng.random() < p                    # noqa: E731

    def pick(values, bad=()):
        return rng.choice(list(bad)) if bad and hostile and maybe(0.3) else rng.choice(list(values))

    mode = pick(["decentralized"] * 4 + ["ps", "ps", "allreduce"])
    a = ["--mode", mode] if maybe(0.7) else []
    if maybe(0.95) or mode != "decentralized":
        a += ["-n", str(pick([2, 4, 6, 8], [1, 3]))]
    if mode == "decentralized":
        if maybe(0.7):
            bad, good = ["empty.json", "binary.json", "disconnected.txt", "duplicate.txt", "selfloop.txt",
                         "weights.json"], ["directed6.txt", "ring4.txt"]
            a += ["--topology", pick(["ring", "ring-based", "double-ring", "exponential", "torus", "complete",
                                      "one-peer-exponential"] + [files[f] for f in good], [files[f] for f in bad])]
        if maybe(0.4):
            a += ["--protocol", pick(["tokens", "queue-only", "notify-ack"])]
        for opt, values, bad, p in [
                ("--max-ig", ["1", "2", "3"], ["0"], 0.3), ("--backup-workers", ["0", "1"], ["2"], 0.3),
                ("--staleness", ["0", "1", "2"], ["-1"], 0.3), ("--stale-reduce", ["weighted", "plain"], (), 0.15),
                ("--skip", ["max-jump=2,trigger=1", "max-jump=2,trigger=2"], ["max-jump=1,trigger=1"], 0.3),
                ("--compute-graph", ["parallel", "serial"], (), 0.2),
                ("--compress", ["fp16", "bf16", "int8", "topk:0.1", "int8,gamma=0.5"], ["topk:0"], 0.25),
                ("--local-steps", ["1", "2", "3"], ["0"], 0.25), ("--outer-optimizer", ["sgd", "nesterov"], (), 0.1),
                ("--outer-momentum", ["0.5"], ["1"], 0.05)]:
            if maybe(p):
                a += [opt, pick(values, bad)]
    if mode == "ps" or maybe(0.05):
        sync = pick(["bsp", "asp", "ssp", "dssp", "elastic", "backup", "esync"])
        a += ["--sync", sync]
        extra = {"ssp": ("--staleness", ["0", "2"], ["-1"]), "dssp": ("--staleness-range", ["1,3"], ["3,1"]),
                 "backup": ("--backup-workers", ["0", "1"], ["9"]), "elastic": ("--lookahead", ["1", "5"], ["0"]),
                 "esync": ("--esync-epsilon", ["0.01"], ["-1"])}.get(sync)
        if extra and maybe(0.5):
            a += [extra[0], pick(extra[1], extra[2])]
    a += ["--iterations", pick(["1", "2", "7", "12"], ["0"])] if maybe(0.85) else ["--epochs", pick(["0.5"], ["0"])]
    for opt, values, bad, p in [
            ("--slowdown", ["random:factor=6,prob=1/n", "rank=1,factor=4"], ["rank=0,factor=2", "rank=1,factor=0.5"], 0.35),
            ("--compute-time", ["0.1", "normal:mean=0.1,std=0.02", "uniform:low=0.05,high=0.2", "1@0.5", "0"], ["-1"], 0.35),
            ("--bandwidth", ["1", "0.01", "1@0.1", "inf"], ["0"], 0.25), ("--latency", ["0", "0.001"], ["-1"], 0.25),
            ("--message-mb", ["0", "0.01", "10"], (), 0.2), ("--nic-duplex", ["full", "half"], (), 0.15),
            ("--send-path", ["zero-copy", "copy"], (), 0.15), ("--eager-limit", ["0", "1000000000"], (), 0.1),
            ("--rendezvous", ["take", "push"], (), 0.1), ("--invariants", ["on", "off", "auto"], (), 0.4),
            ("--seed", ["0", "7"], ["-3"], 0.1)]:
        if maybe(p):
            a += [opt, pick(values, bad)]
    if maybe(0.12):
        a += ["--fault-tolerance"] + pick([["--deaths", "1@0.3"], ["--deaths", "1@0.2,2@0.5"], ["--churn-mttf", "5"]],
                                          [["--deaths", "99@1"]])
    if maybe(0.06):
        a += ["--math", "--model", pick(["mlp", "svm"])]
    return a


@pytest.mark.parametrize("seed", range(CASES))
def test_a_random_command_line_runs_or_is_refused_in_one_line(seed, files, capsys):
    argv = command_line(random.Random(seed), files) + ["--no-progress"]
    try:
        rc = main(argv)
    except SystemExit as e:                              # argparse's own refusals
        rc = e.code
    out, err = capsys.readouterr()
    said = " ".join(argv)
    hop = "--sync" not in argv and "--mode" not in argv or "decentralized" in argv
    if not hop and {"--send-path", "--eager-limit", "--rendezvous"} & set(argv):    # only the Hop simulator
        assert rc == 2, f"{said}: exit {rc}, but a PS or all-reduce run ignores it"   # models sends' completion
    if rc == 2:
        assert err.startswith("hopdec sim: error: ") and err.count("\n") == 1, f"{said}\n{err}"
        return
    assert rc == 0, f"{said}: exit {rc}\n{err}"
    assert "Traceback" not in err and out.startswith("== SIMULATED"), f"{said}\n{out}\n{err}"
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s", line)]
    gap = re.search(r"largest iteration gap observed: (\d+)(?: \([^)]*?: ([\d.e+]+)\))?", out)
    if gap and gap.group(2):
        assert int(gap.group(1)) <= float(gap.group(2)), f"{said}\n{out}"
    if hop and "--iterations" in argv and not {"--skip", "--fault-tolerance"} & set(argv):
        k = int(argv[argv.index("--iterations") + 1])
        h = int(argv[argv.index("--local-steps") + 1]) if "--local-steps" in argv else 1
        assert rows and {int(r[1]) for r in rows} == {math.ceil(k / h)}, f"{said}\n{out}"
        if h > 1:
            assert "rounds run" in out, f"{said}\n{out}"


TOPO_CASES = int(os.environ.get("HOPDEC_FUZZ_CASES", 50))


def topo_command_line(rng, files):
    """``topo analyze`` or ``topo compare`` over generated and hostile files, with network options (some
    invalid, some --machines sizes that fit one file and not another)."""
    maybe = lambda p: rng.random() < p                    # noqa: E731
    names = sorted(files)
    good = ["directed6.txt", "ring4.txt", "warned.txt"]
    pick = lambda: files[rng.choice(good if maybe(0.6) else names)]   # noqa: E731
    net = []
    for opt, values, p in [("--message-mb", ["1", "0.01", "-1"], 0.2), ("--bandwidth", ["10", "0@100", "9@1", "0"], 0.2),
                           ("--latency", ["0", "0.01", "nan"], 0.15), ("--nic-duplex", ["full", "half"], 0.1),
                           ("--machines", ["2,2", "3", "4,2", "0,2"], 0.3)]:
        if maybe(p):
            net += [opt, rng.choice(values)]
    if maybe(0.5):
        a = ["analyze", pick()] + (["--max-ig", rng.choice(["1", "3", "0"])] if maybe(0.3) else []) \
            + (["--staleness", rng.choice(["0", "2"])] if maybe(0.2) else []) \
            + (["--local-steps", rng.choice(["1", "4"])] if maybe(0.2) else [])
    else:
        a = ["compare"] + [pick() for _ in range(rng.choice([1, 2, 3]))]
        a += ["--max-ig", rng.choice(["1", "3"])] if maybe(0.2) else []
    return a + net + (["--json"] if maybe(0.3) else [])


@pytest.mark.parametrize("seed", range(TOPO_CASES))
def test_a_random_topo_command_line_analyzes_or_is_refused_in_one_line(seed, files, capsys):
    """Warnings go with a result: a refused command prints its one error line and nothing else (``topo
    compare ok.txt bad.txt`` printed ok.txt's warnings and then bad.txt's refusal)."""
    from hopdec.cli.main import main as hopdec
    argv = ["topo"] + topo_command_line(random.Random(seed), files)
    try:
        rc = hopdec(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    said = " ".join(argv)
    if rc == 2:
        assert err.startswith("hopdec topo: error: ") and err.count("\n") == 1 and not out, f"{said}\n{err}"
        return
    assert rc == 0 and "Traceback" not in err, f"{said}: exit {rc}\n{err}"
    assert all(line.startswith("hopdec topo: warning: ") for line in err.splitlines()), f"{said}\n{err}"
    if "--json" in argv:
        json.loads(out)
