"""The paper reproductions (``experiments/repro_*.py``): importable without side effects, ``--help``, their pure
helpers, and their smallest runs giving figures in the range the papers' mechanisms imply. Fast (a few
seconds in all; timing-only simulations of tens of iterations, a few --math runs of the digits mlp), no MPI.
"""

import contextlib
import importlib
import io
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXP = os.path.join(ROOT, "experiments")
SCRIPTS = ("repro_hop", "repro_dssp", "repro_elastic", "repro_backup", "repro_esync", "repro_scale")


@pytest.fixture(scope="module")
def mods():
    if EXP not in sys.path:
        sys.path.insert(0, EXP)
    return {name: importlib.import_module(name) for name in SCRIPTS}


def tiny_runner(C):
    return C.Runner(None, verbose=False)


def test_import_has_no_side_effects_and_help_works(mods, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in SCRIPTS:                       # importing wrote nothing, here or in the default cache
        importlib.reload(mods[name])
    assert os.listdir(tmp_path) == []
    for name, m in mods.items():
        assert m.__doc__ and "simulated (virtual) seconds" in " ".join(m.__doc__.split()), name
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as e:
            m.main(["--help"])
        assert e.value.code == 0 and "--quick" in buf.getvalue() and "--report-only" in buf.getvalue(), name


def test_common_helpers(mods):
    C = mods["repro_hop"].C
    assert C.num("1.41x") == 1.41 and C.num("1,724") == 1724 and C.num("-") is None
    assert C.ratio(3.0, 2.0) == "1.50x" and C.ratio(None, 2.0) == "-"
    fig = {"evals": [(0, 0.1, 2.0, 0), (10, 0.85, 0.5, 5), (20, 0.93, 0.3, 10)]}
    assert C.time_to(fig, 0.9) == 20 and C.iters_to(fig, 0.8) == 5 and C.time_to(fig, 0.99) is None
    assert C.median_time_to([fig, fig, {"evals": []}], 0.9) == 20        # one never-reached: still median 20
    assert C.median_time_to([fig, {"evals": []}, {"evals": []}], 0.9) is None
    # times read off an evaluation grid: known as (evaluation before, first evaluation at or above)
    assert C.time_to_range(fig, 0.9) == (10, 20) and C.iters_to_range(fig, 0.8) == (0, 5)
    assert C.time_to_range(fig, 0.05) == (0, 0) and C.time_to_range(fig, 0.99) == (20, float("inf"))
    assert C.median_time_to_range([fig, fig, {"evals": []}], 0.9) == (10, 20)
    assert C.median_time_to_range([fig, {"evals": []}, {"evals": []}], 0.9)[1] == float("inf")
    # 450 on a 30 s grid over 70 on a 10 s grid: 6.43 is somewhere in 420/70 .. 450/60
    assert C.range_ratio((420, 450), (60, 70)) == "6.4x (6.00-7.50)"
    assert C.range_ratio((140, 150), (60, 70)) == "2.1x (2.00-2.50)"
    assert C.range_ratio((999, 1000), (499, 500)) == "2.00x"           # a fine grid: two decimals hold
    assert C.range_ratio((990, 1000), (499, 500)) == "2.00x (1.980-2.005)"
    assert C.range_ratio((100, 100), (50, 50)) == "2.00x"
    base = (60, 70)
    assert C.range_ratio(base, base) == "1.00x" and C.range_ratio(base, tuple([60, 70])) == "1.0x (0.85-1.17)"
    assert C.range_ratio((10, float("inf")), (60, 70)) == "-" and C.range_ratio(None, (1, 2)) == "-"
    assert C.num("6.4x (6.00-7.50)") == 6.4
    assert "every 10 virtual s" in C.grid_note(10)
    rep = C.Report(io.StringIO())
    rep.table("t", ["mode", "x"], [["a", "1.00x"], ["b", 2]])
    assert rep.cell("t", "b", "x") == "2" and "| a | 1.00x |" in rep.out.getvalue()


def test_hop_cluster_model_and_fig21_gaps(mods, tmp_path):
    H = mods["repro_hop"]
    from hopdec import topology as T
    path, out_c, in_c = H.machine_topology("ring-based", 16, (4, 4, 4, 4), str(tmp_path / "rb.json"))
    assert out_c == in_c == [6, 6, 6, 6]       # 2 ring edges + 4 edges to the opposite node leave a machine
    G = T.load(path)                            # one 1 Gb/s NIC per machine, shared by its four workers
    assert [G.nodes[v]["machine"] for v in range(16)] == [f"m{m}" for m in range(4) for _ in range(4)]
    assert {G.nodes[v]["bandwidth"] for v in G.nodes} == {1.0}
    assert not any("bandwidth" in d for _, _, d in G.edges(data=True))
    gaps = []
    for kind in ("ring-based", "hierarchical-a", "hierarchical-b"):
        p, _, _ = H.machine_topology(kind, 8, (4, 2, 2), str(tmp_path / f"{kind}.json"))
        gaps.append(round(T.normalized_laplacian_gap(T.load(p)), 4))
    assert gaps == [0.6667, 0.2682, 0.2688]    # the paper's Fig. 21 numbers


def test_hop_straggler_and_skipping(mods):
    """Figs. 18-19 in miniature: a 4x straggler costs ~3-4x per iteration, skipping up to 10 iterations
    hides it."""
    H = mods["repro_hop"]
    rep = H.C.Report(io.StringIO())
    P = H.Part(tiny_runner(H.C), H.Cfg(seeds=(1,), it_timing=40, it_math=12), rep)
    H.fig18(P)
    cost = {r[0]: H.C.num(r[2]) for r in rep.tables["fig18_timing"][1]}
    assert 2.5 <= cost["standard"] <= 4.5
    assert cost["backup 1 + skip max-jump=10"] <= 1.3
    assert [r[0] for r in rep.tables["fig18_math"][1]] == [name for name, _ in H.STRAG]


def test_dssp_timing_and_variants(mods):
    """With a persistent speed ratio, DSSP (s_U enforced) is paced like SSP; only the variant whose stopped
    worker waits for one push runs at ASP's speed (what Table I's 1.88x needs)."""
    D = mods["repro_dssp"]
    rep = D.C.Report(io.StringIO())
    R = tiny_runner(D.C)
    D.timing_table(rep, lambda a, v: R.run(a, patch=D.VARIANTS[v] if v else None, tag=v),
                   D.Cfg(it_timing=200), D.SLOW, "tiny", "t")
    col = "throughput vs SSP s=3"
    speed = {r[0]: D.C.num(r[2]) for r in rep.tables["t"][1]}
    gap = {r[0]: int(r[4]) for r in rep.tables["t"][1]}
    assert rep.tables["t"][0][2] == col
    assert speed["ASP"] > 1.5 and speed["DSSP [3,15]"] < 1.2 and gap["DSSP [3,15]"] <= 15
    assert speed["DSSP [3,15], s_U not enforced, line 17 waits one push (variant)"] > 1.5


def test_quick_mode_prints_what_it_returns(mods, tmp_path):
    D = mods["repro_dssp"]
    out = io.StringIO()
    rep = D.main(["--quick", "--no-math", "--fresh", "--cache", str(tmp_path / "c.json")], out=out)
    text = out.getvalue()
    for name, (headers, rows) in rep.tables.items():
        assert "| " + " | ".join(headers) + " |" in text
        assert all("| " + " | ".join(r) + " |" in text for r in rows)
    again = D.main(["--quick", "--no-math", "--report-only", "--cache", str(tmp_path / "c.json")],
                   out=io.StringIO())
    assert again.tables == rep.tables          # the cache gives the same tables


def test_elastic_beats_bsp_with_fixed_speeds(mods):
    E = mods["repro_elastic"]
    R = tiny_runner(E.C)
    cluster = E.CLUSTERS[0][1]
    bsp = R.run(E.base(cluster, 40, 1) + ["--sync", "bsp"])
    el = R.run(E.base(cluster, 40, 1) + ["--sync", "elastic", "--lookahead", "15"])
    assert el["grads_per_s"] > 1.1 * bsp["grads_per_s"]
    assert 3.0 < bsp["virtual_s"] / 40 < 4.0   # the 24-hour check: a BSP iteration under 3.63 s


def test_backup_helpers_and_steps(mods):
    B = mods["repro_backup"]
    assert abs((1 - B.P_SLOW) ** B.TOTAL - 0.30) < 0.01
    assert B.interpolate([50, 100], [80, 40], 75) == 60 and B.interpolate([50, 100], [80, 40], 10) == 80
    assert B.estimate(2.0, 50) == 100 and B.estimate(None, 5) is None
    R = tiny_runner(B.C)
    s0 = R.run(B.step_argv(0, 25))["step_s"][5:]
    s4 = R.run(B.step_argv(4, 25))["step_s"][5:]
    assert sum(s4) / len(s4) < sum(s0) / len(s0)


def test_esync_local_steps(mods):
    S = mods["repro_esync"]
    f = tiny_runner(S.C).run(S.base(300) + ["--sync", "esync"])   # 3 rounds (the first: start-up)
    gpu, cpu = f["esync_local_steps_median"][0], f["esync_local_steps_median"][-1]
    assert abs(gpu - S.CPU_S / S.GPU_S) <= 3 and cpu == 1


def test_scale_helpers(mods):
    S = mods["repro_scale"]
    assert S.winner([("a", 1.0), ("b", 1.0), ("c", None)]) == "a"
    assert S.winner([("a", 1.0), ("b", 1.5)]) == "b"
    assert S.job_rate({"virtual_s": 300.0}, 150) == 0.5
    f = tiny_runner(S.C).run(S.argv(16, 30, [], 4))
    assert f["rate_med"] == pytest.approx(1 / S.COMPUTE_S, rel=0.02)   # compute-bound: 0.09 s of sends
