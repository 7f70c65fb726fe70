"""--model pkg.module:factory and --dataset pkg.module:factory: a user's own model and data reach
``hopdec train`` and ``hopdec sim --math`` (logs, report, checkpoints, every mode), and a factory that
breaks its contract is one line naming the option."""

import io
import json
import re
import textwrap

import numpy as np
import pytest

from hopdec.cli.sim import parse as sim_parse
from hopdec.errors import ConfigError
from hopdec.sim.run import simulate

USER_CODE = textwrap.dedent('''
    import numpy as np
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, shape, classes):
            super().__init__()
            self.body = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), 16), nn.ReLU(),
                                      nn.Linear(16, classes))
            self.calls = 0

        def forward(self, x):
            return self.body(x)

        def loss(self, out, y):                     # its own loss: counted, so a test sees it used
            self.calls += 1
            return nn.functional.cross_entropy(out, y)

    def make_model(input_shape, num_classes):
        return Net(input_shape, num_classes)

    def make_data(seed):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(600, 3)).astype(np.float32)
        y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
        return x[:500], y[:500], x[500:], y[500:]

    def bad_labels():
        return np.zeros((4, 2), np.float32), np.zeros(4, np.float32), np.zeros((4, 2), np.float32), np.zeros(4)

    def not_a_module(shape, classes):
        return 42

    class Bare(nn.Module):                          # takes no arguments: knows its own shapes
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(3, 2)

        def forward(self, x):
            return self.body(x)

    def make_bare():
        return Bare()

    class TupleOut(Net):                            # trained with its own loss, then failed at evaluation
        def forward(self, x):
            return self.body(x), 0.0

        def loss(self, out, y):
            return nn.functional.cross_entropy(out[0], y)

    def tuple_out(shape, classes):
        return TupleOut(shape, classes)

    def one_logit(shape, classes):                  # a regression (or single-logit) head: scored 0% accurate
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), 1), nn.Flatten(0))

    def too_few(shape, classes):                    # cross-entropy's IndexError, naming no option
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), 1))

    def wrong_input(shape, classes):
        return nn.Linear(7, classes)

    class AsDouble(nn.Module):                      # float64 throughout: passed the output check, then was
        def __init__(self, shape, classes):         # cast to float32 by the flat buffer and failed mid-training
            super().__init__()
            self.body = nn.Linear(int(np.prod(shape)), classes).double()

        def forward(self, x):
            return self.body(x.double())

    def as_double(shape, classes):
        return AsDouble(shape, classes)

    def lazy(shape, classes):                       # failed on "Can't access the shape of an uninitialized
        return nn.Sequential(nn.Flatten(), nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, classes))   # parameter"

    class Diverges(Net):
        def loss(self, out, y):
            return nn.functional.cross_entropy(out, y) * float("nan")

    def diverges(shape, classes):
        return Diverges(shape, classes)

    def with_bn(shape, classes):                    # BatchNorm's running statistics: buffers no gradient trains
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), 16), nn.BatchNorm1d(16), nn.ReLU(),
                             nn.Linear(16, classes))

    def shifted_data(seed):                         # far from mean 0, variance 1: BatchNorm's initial statistics
        x, y, tx, ty = make_data(seed)
        return x * 10 + 30, y, tx * 10 + 30, ty

    made = [0]

    def seeded_apart(shape, classes):               # a factory that seeds by rank (here: by call)
        import os
        made[0] += 1
        torch.manual_seed(1000 * made[0] + int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
        return Net(shape, classes)

    def tensor_maths(shape, classes):               # int(tensor) fails on the meta device of the layout
        return nn.Linear(int(torch.tensor(shape).prod()), classes)

    def dropped(shape, classes):                    # dropout: its masks drawn from torch's random state
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), 64), nn.Dropout(0.5), nn.ReLU(),
                             nn.Linear(64, classes))

    def counted(shape, classes):                    # a slow factory (downloads, loads weights, prints): its calls
        import os                                   # counted, one line each, naming the rank
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.txt"), "a") as f:
            f.write(os.environ.get("OMPI_COMM_WORLD_RANK", "-") + "\\n")
        return Net(shape, classes)
''')


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    path = tmp_path / "mine.py"
    path.write_text(USER_CODE)
    monkeypatch.chdir(tmp_path)
    return path


def run_sim(argv):
    out = io.StringIO()
    return simulate(sim_parse([str(a) for a in argv]), out=out), out.getvalue()


@pytest.mark.parametrize("form", ["file", "module"])
def test_a_users_model_and_data_train_in_the_simulator(user_file, tmp_path, form):
    spec = f"{user_file}" if form == "file" else "mine"
    res, text = run_sim(["-n", 3, "--model", f"{spec}:make_model", "--dataset", f"{spec}:make_data", "--math",
                         "--iterations", 60, "--lr", 0.2, "--threads", 1, "--log-dir", tmp_path / "logs"])
    assert res["avg_acc"] > 0.85, text                  # a linearly separable problem, learnt
    with open(tmp_path / "logs" / "rank0.jsonl") as f:
        head = json.loads(f.readline())["run"]
    assert head["model"] == f"{spec}:make_model" and head["params"] == 3 * 16 + 16 + 16 * 2 + 2


@pytest.mark.parametrize("factory", ["make_bare", "Bare"])
def test_a_model_factory_without_arguments_is_called_bare(user_file, factory):
    """Like the dataset factory (``factory(seed)`` or ``factory()``): ``def make(): return MyNet()`` raised
    "takes 0 positional arguments but 2 were given"."""
    res, text = run_sim(["-n", 2, "--model", f"mine:{factory}", "--dataset", "mine:make_data", "--math",
                         "--iterations", 40, "--lr", 0.2, "--threads", 1])
    assert res["avg_acc"] > 0.85, text


def test_a_factory_that_cannot_build_on_the_meta_device_is_built_for_real(user_file):
    """A run that trains nothing counts the parameters on torch's meta device; a factory doing arithmetic on
    a tensor (``int(torch.tensor(shape).prod())``) failed there, and the run was refused as "the factory
    raised". A run that trains counts the model it builds."""
    common = ["-n", 2, "--model", "mine:tensor_maths", "--dataset", "mine:make_data", "--threads", 1]
    _, text = run_sim(common + ["--iterations", 4])
    assert "(mine:tensor_maths: 8 parameters x 4 bytes)" in text, text
    res, text = run_sim(common + ["--math", "--iterations", 40, "--lr", 0.2])
    assert res["avg_acc"] > 0.85, text


@pytest.mark.parametrize("mode", [[], ["--mode", "ps", "--sync", "asp"], ["--mode", "allreduce"],
                                  ["--local-steps", "2"]])
def test_a_diverging_run_stops_in_the_simulator_as_under_mpi(user_file, mode):
    """``hopdec train`` stops when the loss becomes NaN (training diverged); ``hopdec sim --math`` trained on
    and reported "train loss nan" and a test accuracy, exit 0, and logged bare NaNs."""
    from hopdec.errors import RunError
    with pytest.raises(RunError) as err:
        run_sim(["-n", 2, "--model", "mine:diverges", "--dataset", "mine:make_data", "--math", "--iterations", 6,
                 "--threads", 1, *mode])
    assert re.fullmatch(r"rank \d: the training loss became nan at iteration 0: training diverged \(a smaller "
                        r"--lr may help\)", str(err.value)), str(err.value)


@pytest.mark.parametrize("sync", ["ssp", "bsp"])
def test_a_parameter_servers_model_with_batchnorm_is_evaluated_with_trained_statistics(user_file, sync):
    """The server applies gradients and never runs a training forward pass, so its BatchNorm kept mean 0 and
    variance 1: "server model: test accuracy 0.09" where the workers reached 0.86. Its statistics are now
    recomputed from training samples before each evaluation; the decentralized run's average, whose buffers
    the workers trained and averaged, is the reference."""
    common = ["-n", 4, "--model", "mine:with_bn", "--dataset", "mine:shifted_data", "--math", "--iterations", 100,
              "--lr", 0.1, "--threads", 1]
    ps, text = run_sim(common + ["--mode", "ps", "--sync", sync])
    hop, _ = run_sim(common)
    assert hop["avg_acc"] > 0.85 and ps["avg_acc"] > 0.85, (ps["avg_acc"], hop["avg_acc"], text)


def test_all_reduce_replicas_start_from_rank_0s_model_in_the_simulator(user_file, tmp_path):
    """The replicas of a factory that seeds apart trained apart to the end (0.80 / 0.79 / 0.74 / 0.77 under
    MPI), reported as "the model (every worker's)"; they now start from rank 0's and stay equal."""
    run_sim(["-n", 3, "--mode", "allreduce", "--model", "mine:seeded_apart", "--dataset", "mine:make_data",
             "--math", "--iterations", 5, "--threads", 1, "--log-dir", tmp_path / "logs", "--save-models"])
    got = [np.load(tmp_path / "logs" / f"params_rank{r}.npy") for r in range(3)]
    assert np.array_equal(got[0], got[1]) and np.array_equal(got[0], got[2])


def test_all_reduce_says_whose_batchnorm_statistics_it_evaluated(user_file):
    """BatchNorm's running statistics are no gradient: each replica keeps its own, so "the model (every
    worker's)" was true of the parameters only; the summary now says the model is rank 0's."""
    common = ["-n", 2, "--mode", "allreduce", "--dataset", "mine:make_data", "--math", "--iterations", 5,
              "--threads", 1]
    _, text = run_sim(common + ["--model", "mine:with_bn"])
    assert "rank 0's model (its parameters every worker's, its BatchNorm statistics its own): test loss" in text
    _, text = run_sim(common + ["--model", "mine:make_model"])
    assert "the model (every worker's): test loss" in text


def test_a_users_model_is_trained_with_its_own_loss(user_file):
    from hopdec.modes.work import resolve
    from hopdec.settings import Work
    work = resolve(Work(model=f"{user_file}:make_model", dataset=f"{user_file}:make_data", iterations=2), 1)
    t = work.trainer(0, 1)
    t.compute()
    assert t.model.calls == 1


@pytest.mark.parametrize("argv, says", [
    (["--dataset", "mine:make_data"], "--dataset mine:make_data: a dataset of your own has no default model"),
    (["--model", "nosuch:make"], "--model nosuch:make: cannot import nosuch (ModuleNotFoundError"),
    (["--model", "mine:nothing"], "--model mine:nothing: mine has no nothing"),
    (["--model", "mine:not_a_module"], "the factory returned int, not a torch.nn.Module"),
    (["--model", "mine:make_data"], "--model mine:make_data: the factory raised TypeError"),
    (["--model", "mlp", "--dataset", "mine:bad_labels"], "train_y and test_y must hold class indices"),
    (["--model", "cnn2"], "--model 'cnn2': expected one of cnn, vgg11"),
    (["--model", "mine.py:"], "--model 'mine.py:': expected one of"),
    # the output checked on two samples before any training
    (["--model", "mine:tuple_out", "--dataset", "mine:make_data"], "--model mine:tuple_out: the model's output is a "
                                                                   "tuple, not a tensor of class scores"),
    (["--model", "mine:one_logit", "--dataset", "mine:make_data"], "--model mine:one_logit: output of shape (2,) for "
                                                                   "targets of shape (2,): expected class scores over "
                                                                   "the last dimension, (2, 2)"),
    (["--model", "mine:too_few", "--dataset", "mine:make_data"], "--model mine:too_few: 1 score(s) per sample for the "
                                                                 "dataset's 2 classes"),
    (["--model", "mine:wrong_input", "--dataset", "mine:make_data"], "--model mine:wrong_input: the model raised "
                                                                     "RuntimeError: mat1 and mat2 shapes"),
    # what the flat float32 buffer cannot hold, named before anything is built on it
    (["--model", "mine:as_double", "--dataset", "mine:make_data"], "--model mine:as_double: body.weight is "
                                                                   "torch.float64: hopdec trains float32 parameters"),
    (["--model", "mine:lazy", "--dataset", "mine:make_data"], "--model mine:lazy: 1.weight is not initialized (a "
                                                              "lazy module such as LazyLinear)"),
])
def test_a_broken_factory_is_one_line_naming_the_option(user_file, argv, says):
    with pytest.raises(ConfigError) as err:
        run_sim(["-n", 2, "--math", "--iterations", 1] + argv)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_users_model_in_every_mode_on_mpi_with_logs_report_and_resume(mpirun, tmp_path):
    """Real ranks: decentralized with a checkpoint then resumed, and all-reduce; the report reads the logs."""
    path = tmp_path / "mine.py"
    path.write_text(USER_CODE)
    user = ["--model", f"{path}:make_model", "--dataset", f"{path}:make_data", "--no-progress", "--threads", "1"]
    ck = tmp_path / "ck"
    outs = mpirun.batch(2, [user + ["--iterations", "3", "--checkpoint-dir", ck, "--log-dir", tmp_path / "hop"],
                            user + ["--iterations", "6", "--resume", ck, "--log-dir", tmp_path / "hop"],
                            user + ["--mode", "allreduce", "--iterations", "4", "--log-dir", tmp_path / "ar"],
                            user[:1] + [f"{path}:seeded_apart"] + user[2:] + [
                                "--mode", "allreduce", "--iterations", "4", "--log-dir", tmp_path / "apart",
                                "--save-models"]],
                        timeout=120)
    assert [o.returncode for o in outs] == [0, 0, 0, 0], [(o.stdout[-1500:], o.stderr[-1500:]) for o in outs]
    # a factory that seeds by rank: every replica starts from rank 0's model (as DDP), so they stay equal
    assert np.array_equal(np.load(tmp_path / "apart" / "params_rank0.npy"),
                          np.load(tmp_path / "apart" / "params_rank1.npy"))
    assert "synchronous all-reduce" in outs[2].stdout
    from hopdec.report.data import Run
    for d, its in (("hop", 6), ("ar", 4)):
        run = Run.load(str(tmp_path / d))
        assert sorted({r["iter"] for r in run.records[0]}) == list(range(its))


@pytest.mark.parametrize("mode", [[], ["--mode", "ps", "--sync", "asp"], ["--mode", "allreduce"]])
@pytest.mark.parametrize("math", [True, False])
def test_a_model_factory_is_called_once_in_the_simulator(user_file, mode, math):
    """The factory was called on torch's meta device to count the parameters, then once per simulated worker
    (and for the parameter server's model): 4 or 5 calls here, a slow factory's cost paid as often. The
    workers now start from copies of one model; a timing-only run builds none and counts on meta."""
    res, text = run_sim(["-n", 3, "--model", f"{user_file}:counted", "--dataset", "mine:make_data", "--iterations", 3,
                         "--threads", 1, *mode] + ["--math"] * math)
    assert (user_file.parent / "calls.txt").read_text().splitlines() == ["-"], text


def test_workers_given_one_built_model_train_as_if_each_built_its_own(user_file):
    """Building leaves torch's random state where dropout then draws from: a trainer given the model built
    once (a rank's, or a copy in a simulation) restores that state, so its losses are those of a trainer that
    seeded and built the model itself (as every trainer did when each called the factory)."""
    from hopdec.ml.data import partition
    from hopdec.ml.trainer import LocalTrainer
    from hopdec.modes.work import resolve
    from hopdec.settings import Work
    work = Work(model="mine:dropped", dataset="mine:make_data", seed=3)
    alone = []
    for part in range(2):
        w = resolve(work, 2)
        hp = w.hparams
        t = LocalTrainer(w.model, w.dataset, partition(w.dataset.train_y, 2, part, seed=3), lr=hp["lr"],
                         batch_size=hp["batch_size"], seed=3, data_seed=3 * 7919 + part)
        alone.append([t.compute() for _ in range(3)])
    for copies in (False, True):
        w = resolve(work, 2, trains=True, copies=copies)
        w.layout()                                  # (built here, as the ranks' agreement does)
        given = []
        for part in range(2):
            t = w.trainer(part, 2)
            given.append([t.compute() for _ in range(3)])
        assert given == alone, copies


def test_a_model_factory_is_called_once_per_rank_on_mpi(mpirun, tmp_path):
    """Every mode on real ranks, with rank 0's evaluator of the average model (--eval-interval) and a resumed
    run: each rank called the factory twice (on the meta device for the layout, then for real), rank 0 three
    times with the evaluator."""
    path = tmp_path / "mine.py"
    path.write_text(USER_CODE)
    user = ["--model", f"{path}:counted", "--dataset", f"{path}:make_data", "--no-progress", "--threads", "1"]
    ck = tmp_path / "ck"
    runs = [user + ["--iterations", "4", "--consensus-every", "2", "--eval-interval", "0.001",
                    "--checkpoint-dir", ck, "--log-dir", tmp_path / "hop"],
            user + ["--iterations", "6", "--resume", ck, "--log-dir", tmp_path / "hop"],
            user + ["--mode", "ps", "--sync", "asp", "--iterations", "3"],
            user + ["--mode", "allreduce", "--iterations", "3"]]
    outs = mpirun.batch(2, runs, timeout=180)
    assert [o.returncode for o in outs] == [0] * len(runs), [(o.stdout[-1500:], o.stderr[-1500:]) for o in outs]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert sorted(calls) == ["0"] * len(runs) + ["1"] * len(runs), calls


SMALL_SHARDS = ("note: the smallest shard holds 62 training samples (500 over 8 workers), fewer than --batch-size "
                "128: its batches are the whole shard, 62 samples, not 128 (a --batch-size of at most 62, or fewer "
                "workers, gives the batches asked for)")


@pytest.mark.parametrize("mode", [[], ["--mode", "ps", "--sync", "asp"], ["--mode", "allreduce"]])
def test_shards_smaller_than_the_batch_are_one_note(user_file, capsys, mode):
    """500 samples over 8 workers with --batch-size 128 trained on batches of 62 without a word; one note now
    names the smallest shard, its size and the batch size. Shards that fill a batch get none, and so does a
    run that draws no batch."""
    common = ["-n", 8, "--model", "mine:make_model", "--dataset", "mine:make_data", "--math", "--iterations", 2,
              "--threads", 1, *mode]
    run_sim(common + ["--batch-size", 128])
    err = capsys.readouterr().err
    assert [x for x in err.splitlines() if "shard" in x] == ["hopdec sim: " + SMALL_SHARDS], err
    run_sim(common + ["--batch-size", 62])
    assert "shard" not in capsys.readouterr().err
    run_sim([a for a in common if a != "--math"] + ["--batch-size", 128])     # timing only: no batch is drawn
    assert "shard" not in capsys.readouterr().err
    run_sim(common[:1] + [1] + common[2:] + ["--batch-size", 501])
    assert ("hopdec sim: note: the training set holds 500 samples, fewer than --batch-size 501: every batch is the "
            "whole set, 500 samples, not 501") in capsys.readouterr().err.splitlines()


def test_shards_smaller_than_the_batch_are_one_note_on_mpi(mpirun, tmp_path):
    """Printed once (by rank 0), from the workers' shards: a parameter server's one worker holds all 500."""
    path = tmp_path / "mine.py"
    path.write_text(USER_CODE)
    user = ["--model", f"{path}:make_model", "--dataset", f"{path}:make_data", "--no-progress", "--threads", "1",
            "--iterations", "2", "--batch-size", "300"]
    outs = mpirun.batch(2, [user, user + ["--mode", "ps", "--sync", "asp"]], timeout=120)
    assert [o.returncode for o in outs] == [0, 0], [(o.stdout[-1500:], o.stderr[-1500:]) for o in outs]
    notes = [[x for x in o.stderr.splitlines() if "shard" in x] for o in outs]
    assert notes == [["hopdec train: note: the smallest shard holds 250 training samples (500 over 2 workers), "
                      "fewer than --batch-size 300: its batches are the whole shard, 250 samples, not 300 (a "
                      "--batch-size of at most 250, or fewer workers, gives the batches asked for)"], []], notes
