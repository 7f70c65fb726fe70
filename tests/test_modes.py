"""One run assembly per mode, three executors: real MPI ranks, the virtual-time simulator and the seeded
in-process scheduler carry out the same run and say the same things about it.

The drift this guards against: a topology with per-node backup workers was "standard" in a simulated
run and "backup" in a real one (the simulator named the setting without the graph).
"""

import io
import json

import numpy as np
import pytest

from hopdec import topology as T
from hopdec.cli.sim import parse as sim_parse
from hopdec.cli.train import parse as train_parse
from hopdec.sim.run import simulate

COMMON = ["--model", "mlp", "--iterations", "5", "--seed", "2", "--no-progress", "--threads", "1"]
EXECUTOR_FIELDS = {"pid", "host", "device", "emulation", "simulated", "cost_model", "mpi_buffers",
                   "message_bytes", "consensus_every", "fault_tolerance", "run_id"}
"""Header fields that say what executed the run (where the parameters lived, what was emulated or
simulated), not what the run is: the only ones a real and a simulated header may differ in."""


def backup_topology(tmp_path):
    """The complete graph on 4 workers with one backup worker per node, as node attributes of the file."""
    g = T.complete(4)
    for v in g.nodes:
        g.nodes[v]["backup_workers"] = 1
    path = tmp_path / "complete4_backup.json"
    T.save(g, str(path))
    return path


def sim(argv):
    out = io.StringIO()
    res = simulate(sim_parse([str(a) for a in argv]), out=out)
    return res, out.getvalue()


def header(d, rank):
    with open(d / f"rank{rank}.jsonl") as f:
        return json.loads(f.readline())["run"]


def title(text):
    """The summary's title, without the simulator's fidelity label."""
    line = next(ln for ln in text.splitlines() if ln.startswith("== "))
    return line[3:-3].split(": ", 1)[1] if line.startswith("== SIMULATED") else line[3:-3]


def test_per_node_backup_workers_are_the_backup_setting_in_a_simulated_run(tmp_path):
    path = backup_topology(tmp_path)
    res, text = sim(["--topology", path, "--iterations", 3, "--model", "mlp", "--log-dir", tmp_path / "s"])
    assert res["setting"] == "backup" and header(tmp_path / "s", 0)["setting"] == "backup"
    assert title(text).startswith("decentralized backup on ")


def test_the_in_process_scheduler_and_the_simulator_run_the_same_assembly(tmp_path):
    """On the complete graph with the standard protocol every Reduce is the plain mean of iteration k's
    parameters, whatever the interleaving: both executors end at the same parameters."""
    from hopdec.modes.decentralized import HopRun, resolve_topology
    from hopdec.modes.work import resolve
    from hopdec.sim.inproc import InProcNetwork

    argv = ["--topology", "complete", "-n", 4, "--math", "--save-models", "--log-dir", tmp_path / "s"] + COMMON
    sim(argv)
    settings = sim_parse([str(a) for a in argv])
    run = HopRun(settings, resolve_topology("complete", 4)).with_work(resolve(settings.work, 4))
    net = InProcNetwork.of(run, seed=5, speeds=[1, 3, 1, 2]).run()
    for r in range(4):
        np.testing.assert_allclose(net.trainers[r].write_params(), np.load(tmp_path / "s" / f"params_rank{r}.npy"),
                                   rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def real_runs(mpirun, tmp_path_factory):
    """Four small runs in one ``mpirun -n 4`` job: per-node backup workers, the complete graph (models
    saved), a parameter server with 3 workers, and synchronous all-reduce (models saved, one slow rank)."""
    base = tmp_path_factory.mktemp("modes")
    topo = backup_topology(base)
    runs = {"backup": ["--topology", topo] + COMMON,
            "complete": ["--topology", "complete", "--save-models"] + COMMON,
            "ps": ["--sync", "ssp", "--staleness", "1"] + COMMON,
            "allreduce": ["--mode", "allreduce", "--save-models", "--slowdown", "rank=1,factor=2"] + COMMON}
    argvs = [args + ["--log-dir", base / f"real_{name}"] for name, args in runs.items()]
    outs = dict(zip(runs, mpirun.batch(4, argvs, timeout=240)))
    for name, out in outs.items():
        assert out.returncode == 0, (name, out.stdout[-2000:], out.stderr[-2000:])
    return base, runs, outs


@pytest.mark.parametrize("name", ["backup", "complete", "ps", "allreduce"])
def test_a_real_and_a_simulated_run_say_the_same(real_runs, name):
    """Same title, same setting name, same header (every field but the executor's own)."""
    base, runs, outs = real_runs
    extra = {"ps": ["-n", 3], "complete": ["-n", 4], "allreduce": ["-n", 4]}.get(name, [])
    timing_only = [a for a in runs[name] if a != "--save-models"]      # (saving needs --math)
    res, text = sim(timing_only + extra + ["--log-dir", base / f"sim_{name}"])
    assert title(text) == title(outs[name].stdout)
    for rank in (0, 1):
        real, simulated = header(base / f"real_{name}", rank), header(base / f"sim_{name}", rank)
        assert simulated["simulated"] == "SIMULATED (timing only)" and "simulated" not in real
        shared = (set(real) & set(simulated)) - EXECUTOR_FIELDS
        assert shared >= {"mode", "iterations", "model", "params", "hparams", "seed", "gap_bound"}
        assert {k: real[k] for k in shared} == {k: simulated[k] for k in shared}, rank
    if name == "backup":
        assert header(base / "real_backup", 0)["setting"] == res["setting"] == "backup"


def test_a_real_and_a_simulated_run_end_at_the_same_parameters(real_runs, tmp_path):
    base, runs, _ = real_runs
    sim(runs["complete"] + ["-n", 4, "--math", "--log-dir", tmp_path])
    for r in range(4):
        np.testing.assert_allclose(np.load(base / "real_complete" / f"params_rank{r}.npy"),
                                   np.load(tmp_path / f"params_rank{r}.npy"), rtol=1e-5, atol=1e-6)


def test_a_real_and_a_simulated_all_reduce_end_at_the_same_identical_models(real_runs, tmp_path):
    """--mode allreduce: every real rank ends at the same parameters (one mean gradient, one optimizer),
    and the simulator's --math run of the same assembly ends there too, slowdown or not."""
    base, runs, outs = real_runs
    real = [np.load(base / "real_allreduce" / f"params_rank{r}.npy") for r in range(4)]
    for r in range(1, 4):
        np.testing.assert_array_equal(real[0], real[r])
    res, _ = sim(runs["allreduce"] + ["-n", 4, "--math", "--log-dir", tmp_path])
    for r in range(4):
        np.testing.assert_allclose(real[0], np.load(tmp_path / f"params_rank{r}.npy"), rtol=1e-5, atol=1e-6)
    assert res["max_gap"] == 1 and "synchronous all-reduce" in outs["allreduce"].stdout


def test_setting_names_drift_fixed_in_train_and_sim_settings():
    """Both commands parse into the same settings for the options they share."""
    argv = ["--topology", "ring", "--max-ig", "3", "--backup-workers", "1", "--skip", "max-jump=2"] + COMMON
    real, simulated = train_parse(argv), sim_parse(argv + ["-n", "8"])
    for group in ("work", "protocol", "ps", "observe"):
        assert getattr(real, group) == getattr(simulated, group)
    assert real.cost is None and simulated.cost.workers == 8


# ---- a new sync model is one module plus one registration line ------------------------------------
def toy_module():
    """What ``hopdec/ps/sync/toy.py`` would hold: a policy with its name, usage, options and a record type
    its checkpoints carry (the checkpoint decoder must take it without being told)."""
    from dataclasses import dataclass

    from hopdec.ps.sync.base import Policy, option_int

    @dataclass
    class Seen:
        pushes: int = 0

    class ToyPolicy(Policy):
        """Apply every gradient at once; a worker waits while it is more than ``s`` pushes ahead of the
        slowest (SSP, in a dozen lines)."""

        sync = "toy"
        usage = "toy (--staleness s, default 1)"
        options = ("staleness",)
        records = (Seen,)

        @classmethod
        def from_options(cls, workers, staleness=None, **_):
            return cls(workers, 1 if staleness is None else option_int("--staleness", staleness, 0))

        def __init__(self, workers, s):
            super().__init__(workers)
            self.s, self.seen = s, {w: Seen() for w in self.workers}

        def settings(self):
            return {"staleness": self.s}

        def gap_bound(self):
            return self.s

        def _push(self, worker, step, now, local_steps):
            self.seen[worker].pushes += 1
            return [self._apply([(worker, self.push_weight)], staleness=[self.version - step])] + self._ready()

        def _removed(self, worker, now):
            return self._ready()

        def _ready(self):
            low = self.slowest_pushes()
            ready = [w for w in self.workers if w in self.waiting and self.pushes[w] - low <= self.s]
            return [self._release(ready)] if ready else []
    return ToyPolicy


@pytest.fixture
def toy():
    from hopdec.ps.sync import POLICIES, register
    cls = register(toy_module())                     # the one registration line
    try:
        yield cls
    finally:
        POLICIES.pop(cls.sync)


def test_a_registered_sync_model_runs_everywhere(toy, tmp_path):
    from hopdec.cli.train import build_parser
    from hopdec.ps.server import Server
    assert "toy (--staleness s, default 1)" in " ".join(build_parser().format_help().split())
    assert train_parse(["--sync", "toy", "--staleness", "2"]).ps.policy(range(1, 4)).settings() == {"staleness": 2}
    res, text = sim(["--sync", "toy", "-n", 4, "--iterations", 30, "--compute-time", "3@0.3",
                     "--log-dir", tmp_path / "s"])
    assert title(text) == "parameter server --sync toy staleness=1 (1 server + 4 workers)"
    assert res["max_gap"] <= 1 and "the sync model's gap bound held" in text
    policy = res["policy"]
    # the policy sees the budget's pushes, no more; the server's work also counts those it discarded
    assert sum(r.pushes for r in policy.seen.values()) == 120 <= res["sim"].server.work
    again = Server(type(policy).from_options(policy.workers), budget=120)     # a checkpoint's books come back
    again.policy.load_state(policy.state())
    assert again.policy.seen == policy.seen and type(next(iter(again.policy.seen.values()))).__name__ == "Seen"
