"""The simulator validated against real runs: the same configurations under ``mpirun`` and in ``hopdec sim``.

One ``mpirun -n 8`` job (about 60 s; a second one only when the first disagrees) trains the cases of :mod:`hopdec.sim.validate` one after the other
(a driver calls ``hopdec train`` once per case): on ring_based_8 with a random 6x slowdown (prob 1/n),
max_ig 4: standard, backup workers 1, staleness 3; and a parameter server with 7 workers, rank 3 three
times slower: BSP and sync SGD with 1 backup worker. Then ``hopdec sim`` runs the same options and seed
(the slowdowns are the same draws: the simulator uses the real Emulator's).

Tolerances, chosen from ``experiments/validate_sim.py`` (2 x 3 repeats, see experiments/README.md): the
decentralized throughput ratios (backup/standard ~1.3, staleness/standard ~1.4) agreed within 1.7%; we
allow 10% (a simulator that ignored the mechanism would be off by 25% or more). ps-backup/ps-bsp (~2.8)
agreed within 2.4% in one series and within 9.1% in the other (a real run slowed by the machine's load:
the PS backup mode's 57 ms iterations feel it most); we allow 15% (ignoring backup workers would give
1.0). The largest iteration gaps: the bounded ones equal in every run; PS backup's unbounded gap within
3 of ~43; we allow 1, and 10% for PS backup.

Conditions: the real runs use the transport's copying send path (the driver in
:data:`hopdec.sim.validate.DRIVER` turns the trainer's zero-copy send storage off) and the simulator
``--latency 0.0025``, this machine's effective message latency (MPI over shared memory
with 8 ranks polling on 2 cores: BSP's step takes ~5 ms longer than its compute). With the default
zero-copy sends, a worker's Reduce waits until its previous sends were received (``wait_sent``), which
over shared memory (rendezvous above the eager limit) happens only when the receiver next polls -- after
its compute: backup workers and staleness then gain less than the protocol allows (13-20 ms of such
waiting per iteration here; experiments/README.md). That is the transport, not the protocol, and the
simulator does not model it.
"""

import io
import json

import pytest

from hopdec.cli.sim import parse
from hopdec.runtime.metrics import read_log
from hopdec.sim import validate as V
from hopdec.sim.run import simulate

ITERATIONS = 60
SIM_LATENCY = 0.0025
RATIO_TOLERANCE = {"backup/standard": 0.10, "staleness/standard": 0.10, "ps-backup/ps-bsp": 0.15}


def disagreements(real, sim):
    """What does not agree within the tolerances (empty: all does)."""
    out = []
    got, want = V.ratios(sim), V.ratios(real)
    for key in want:
        if abs(got[key] / want[key] - 1) > RATIO_TOLERANCE[key]:
            out.append(f"{key}: real {want[key]:.3f}, simulated {got[key]:.3f}")
    for c in V.CASES:
        g, r = sim[c]["gap"], real[c]["gap"]
        if (abs(g - r) > 0.10 * r) if c == "ps-backup" else (abs(g - r) > 1):
            out.append(f"{c} gap: real {r}, simulated {g}")
    return out


@pytest.fixture(scope="module")
def real_and_sim(mpirun, tmp_path_factory):
    """Simulate the cases, run them for real; if they disagree, run them for real once more and keep the
    second measurement (the machine is shared: a disagreement made by other jobs' load does not repeat,
    one made by a wrong simulator does). ``tries`` says which happened."""
    base = tmp_path_factory.mktemp("sim_validation")
    driver = base / "driver.py"
    driver.write_text(V.DRIVER)
    for c in V.CASES:
        simulate(parse(V.sim_argv(c, ITERATIONS, base / f"sim_{c}", latency=SIM_LATENCY)),
                 out=io.StringIO())
    sim = {c: V.metrics(base / f"sim_{c}") for c in V.CASES}
    tries = []
    for attempt in range(2):
        runs = [V.train_argv(c, ITERATIONS, base / f"real{attempt}_{c}") for c in V.CASES]
        proc = mpirun.python(V.RANKS, [driver, json.dumps(runs), "copy"], timeout=400)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        real = {c: V.metrics(base / f"real{attempt}_{c}") for c in V.CASES}
        tries.append(disagreements(real, sim))
        if not tries[-1]:
            break
    return base, attempt, real, sim, tries


def test_same_configuration_on_both_sides(real_and_sim):
    base, attempt, real, sim, _ = real_and_sim
    for c in V.CASES:
        r, s = V.header(base / f"real{attempt}_{c}"), V.header(base / f"sim_{c}")
        assert "simulated" not in r and s["simulated"] == "SIMULATED (timing only)"
        for key in ("mode", "iterations", "seed", "setting", "max_ig", "sync", "settings"):
            assert r.get(key) == s.get(key), (c, key)
        assert real[c]["workers"] == sim[c]["workers"] == (7 if c.startswith("ps-") else 8)
    # the real runs did use the copying send path: Reduce never waited for a slow receiver
    for c in ("backup", "staleness"):
        recs = [r for p in sorted((base / f"real{attempt}_{c}").glob("rank*.jsonl")) for r in read_log(p)]
        assert sum(r["reduce_s"] for r in recs) / len(recs) < 0.005, c


def test_throughput_ratios_agree(real_and_sim):
    _, _, real, sim, tries = real_and_sim
    got, want = V.ratios(sim), V.ratios(real)
    assert set(got) == {"backup/standard", "staleness/standard", "ps-backup/ps-bsp"}
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=RATIO_TOLERANCE[key]), (key, want, got, tries)
    # the mechanisms do something here (so agreement is not agreement on nothing)
    assert want["backup/standard"] > 1.15 and want["staleness/standard"] > 1.15
    assert want["ps-backup/ps-bsp"] > 2


def test_largest_iteration_gaps_agree(real_and_sim):
    _, _, real, sim, tries = real_and_sim
    for c in V.CASES:
        if c == "ps-backup":      # unbounded: the straggler falls behind for the whole run
            assert sim[c]["gap"] == pytest.approx(real[c]["gap"], rel=0.10), (real[c], sim[c], tries)
        else:
            assert abs(sim[c]["gap"] - real[c]["gap"]) <= 1, (c, real[c], sim[c], tries)
    assert sim["ps-bsp"]["gap"] == real["ps-bsp"]["gap"] == 0
