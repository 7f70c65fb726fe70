"""``experiments/bench_exchange.py`` runs: the table (hopdec against bare mpi4py) and ``--ablation``, on a
small plan with real ``mpirun`` (the figures themselves are measured, not tested)."""

import json

import networkx as nx
import pytest

from hopdec import topology as T
from conftest import ROOT

BENCH = f"{ROOT}/experiments/bench_exchange.py"


@pytest.fixture
def ring3(tmp_path):
    path = tmp_path / "ring3.json"
    path.write_text(json.dumps(nx.node_link_data(T.ring(3), edges="edges")))
    return str(path)


def test_the_table_has_a_row_per_size_with_both_sides(mpirun, ring3):
    out = mpirun.python(3, [BENCH, "--topology", ring3, "--plan", "0.01:1:3:2,0.02:1:3:1", "--json",
                            "--no-busy"], timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ranks"] == 3 and got["topology"] == "ring3.json"
    assert [r["mb"] for r in got["rows"]] == [0.01, 0.02]
    assert all(r["hopdec_ms"] > 0 and r["bare_ms"] > 0 for r in got["rows"])


def test_the_ablation_runs_every_variant(mpirun, ring3):
    """Before: the variant that polls only in wait overrode the transport's shutdown drain with an old
    signature, so ``--ablation`` failed on every rank with a TypeError at its first close."""
    out = mpirun.python(3, [BENCH, "--topology", ring3, "--ablation", "0.01", "--reps", "2", "--timed", "5"],
                        timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    rows = [ln for ln in out.stdout.splitlines() if "x bare" in ln]
    assert [ln.split("  ")[1].strip() for ln in rows] == [
        "bare", "bare + send copy", "bare + 3 recv slots", "bare + copy + 3 slots", "hopdec",
        "hopdec queue-only (no grants)", "hopdec poll only in wait", "hopdec no pre-action polls",
        "hopdec sleep-first wait", "hopdec busy wait", "hopdec naps at once (no spin)", "hopdec spin 400 us",
        "hopdec spin 10 ms"]
    assert all(float(ln.split()[-2].rstrip("x")) > 0 for ln in rows)
    assert "3+5 iterations x 2 interleaved reps" in out.stdout
