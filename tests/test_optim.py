"""The Hop optimizer as a torch optimizer, in one process (one rank: the protocol runs with no neighbours),
and the transformer workload's parts: the corpus, the model, AdamW on the flat buffer, the schedule."""

import json
import os
import re
import time
import sys

import pytest
import torch

from hopdec.errors import ConfigError
from hopdec.optim import HopOptimizer, HopSGD

TOPOLOGIES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "topologies")


def net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))


def train(model, opt, steps, start=0):
    for k in range(start, start + steps):
        g = torch.Generator().manual_seed(k)
        x = torch.randn(16, 4, generator=g)
        opt.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step(loss=loss) if isinstance(opt, HopOptimizer) else opt.step()


@pytest.fixture
def finish_all():
    made = []
    yield made
    for o in made:
        o.finish()


def test_it_is_a_torch_optimizer_with_the_wrapped_ones_groups(finish_all):
    m = net()
    opt = HopOptimizer([{"params": m[0].parameters(), "lr": 0.1}, {"params": m[2].parameters()}],
                       torch.optim.AdamW, model=m, lr=0.01, weight_decay=0.0)
    finish_all.append(opt)
    assert isinstance(opt, torch.optim.Optimizer) and isinstance(opt.optimizer, torch.optim.AdamW)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]
    assert opt.param_groups is opt.optimizer.param_groups
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 ** k)
    seen = []
    opt.optimizer.register_step_pre_hook(lambda o, a, kw: seen.append(o.param_groups[1]["lr"]))
    trained = list(m[0].parameters()) + list(m[2].parameters())
    before = [p.detach().clone() for p in trained]
    for _ in range(3):
        train(m, opt, 1)
        sched.step()
    assert seen == pytest.approx([0.01, 0.005, 0.0025])
    assert all(not torch.equal(a, p) for a, p in zip(before, trained))
    assert torch.equal(m[1].weight, torch.ones(8))                    # not in a group: not trained
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in trained)


def test_hop_sgd_steps_as_torch_sgd_on_one_rank(finish_all):
    a, b = net(1), net(1)
    opt = HopSGD(a, lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=True)
    finish_all.append(opt)
    ref = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=True)
    train(a, opt, 4)
    train(b, ref, 4)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)


def test_state_dict_round_trip_resumes_at_the_position(tmp_path, finish_all):
    m = net()
    opt = HopOptimizer(m, torch.optim.Adam, lr=0.01)
    train(m, opt, 5)
    torch.save({"m": m.state_dict(), "o": opt.state_dict()}, tmp_path / "ck.pt")
    train(m, opt, 3, start=5)
    opt.finish()
    m2 = net(7)
    opt2 = HopOptimizer(m2, torch.optim.Adam, lr=0.01)
    finish_all.append(opt2)
    ck = torch.load(tmp_path / "ck.pt", weights_only=True)
    m2.load_state_dict(ck["m"])
    opt2.load_state_dict(ck["o"])
    assert opt2.iteration == 5 == ck["o"]["hop"]["position"]
    train(m2, opt2, 3, start=5)
    for p, q in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="after the first step"):
        opt2.load_state_dict(ck["o"])


def test_a_state_dict_after_finish_with_a_log_gives_the_whole_logs_offset(tmp_path):
    """``opt.state_dict()`` after ``finish()`` (a checkpoint at the end of a script) with ``log_dir`` failed
    with AttributeError ('NoneType' object has no attribute 'flush': the log was closed)."""
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1, log_dir=str(tmp_path))
    train(m, opt, 3)
    opt.finish()
    hop = opt.state_dict()["hop"]
    assert hop["position"] == 3
    assert hop["log_offset"] == os.path.getsize(tmp_path / "rank0.jsonl") > 0


def test_a_global_step_hook_sees_each_optimizer_once_per_step(finish_all):
    """As the README says (and as with torch's own wrappers): one call for ``opt.step()`` and one for the
    wrapped optimizer's step inside it, each with its own optimizer, the outer one first."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1)
    finish_all.append(opt)
    seen = []
    handles = [register_optimizer_step_pre_hook(lambda o, a, kw: seen.append(("pre", type(o).__name__))),
               register_optimizer_step_post_hook(lambda o, a, kw: seen.append(("post", type(o).__name__)))]
    try:
        train(m, opt, 2)
    finally:
        for h in handles:
            h.remove()
    one = [("pre", "HopOptimizer"), ("pre", "SGD"), ("post", "SGD"), ("post", "HopOptimizer")]
    assert seen == one * 2, seen


def test_state_dict_hooks_registered_on_it_run_as_on_a_torch_optimizer(finish_all):
    """``register_state_dict_pre/post_hook`` and ``register_load_state_dict_pre/post_hook`` on the
    HopOptimizer (torch's API, e.g. for a checkpointing library) were silently never called: its
    ``state_dict()`` and ``load_state_dict()`` ran the wrapped optimizer's hooks only."""
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1)
    finish_all.append(opt)
    seen = []
    opt.register_state_dict_pre_hook(lambda o: seen.append(("pre", o is opt)))
    opt.register_state_dict_post_hook(lambda o, sd: dict(sd, extra=sorted(sd)))
    train(m, opt, 2)
    sd = opt.state_dict()
    assert seen == [("pre", True)] and sd["extra"] == ["hop", "param_groups", "state"], (seen, sorted(sd))

    def edit(o, sd):
        seen.append(("load pre", o is opt2, sd["hop"]["position"]))
        sd = dict(sd)
        sd["param_groups"] = [dict(g, lr=0.25) for g in sd["param_groups"]]
        return sd
    m2 = net()
    opt2 = HopOptimizer(m2, torch.optim.SGD, lr=0.1)
    finish_all.append(opt2)
    opt2.register_load_state_dict_pre_hook(edit)
    opt2.register_load_state_dict_post_hook(lambda o: seen.append(("load post", o.iteration)))
    opt2.load_state_dict(sd)
    assert seen[1:] == [("load pre", True, 2), ("load post", 2)], seen
    assert opt2.param_groups[0]["lr"] == 0.25


def test_nothing_is_silently_ignored(finish_all):
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1)
    finish_all.append(opt)
    with pytest.raises(AttributeError, match="param_groups"):
        opt.lr = 0.5
    with pytest.raises(AttributeError, match="fixed"):
        opt.optimizer = torch.optim.Adam(m.parameters())
    with pytest.raises(ConfigError, match="add_param_group"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    opt.param_groups[0]["lr"] = 0.5                                   # the torch way works
    assert opt.optimizer.param_groups[0]["lr"] == 0.5
    # appending to param_groups went around add_param_group(): the new parameter was stepped by the wrapped
    # optimizer but never averaged, without a word; the next step refuses it
    extra = torch.nn.Parameter(torch.zeros(2))
    opt.param_groups.append(dict(opt.param_groups[0], params=[extra]))
    m(torch.randn(3, 4)).sum().backward()
    with pytest.raises(ConfigError, match="param_groups changed after construction"):
        opt.step()
    opt.param_groups.pop()


@pytest.mark.parametrize("kwargs,match", [
    (dict(params=None, optimizer_class=None), "optimizer_class is required"),
    (dict(optimizer_class=dict), "not a torch.optim.Optimizer"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, topology="no-such-kind"), "no such file, and not a generator"),
    # a generator that cannot build this many ranks, a file for another size: prefixed like the rest, one rank
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, topology="torus"),
     r"^HopOptimizer: topology torus: torus needs n >= 4, got 1$"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, topology=os.path.join(TOPOLOGIES, "complete_4.json")),
     r"^HopOptimizer: topology .*complete_4.json has 4 workers but the communicator has 1 rank$"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, max_ig=0), "max_ig 0"),
    # the CLI's ranges too (one settings.Protocol for both): a gap bound no run can reach, a jump of 1
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, max_ig=10 ** 7), r"max_ig 10000000: must be an integer in \[1"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, skip={"max_jump": 1}), "a jump of 0 or 1 never skips"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, skip="max-jump=3", protocol="notify-ack"), "skip needs"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, average_buffers=True, model=None, params="list"), "needs the model"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, betas=(0.9, 0.9)), "SGD.*'betas'$"),
    # a mistyped argument of HopOptimizer's own reaches the inner optimizer: say which was meant
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, topolgy="ring"),
     r"unexpected keyword argument 'topolgy'; did you mean topology= \(a HopOptimizer argument\)\?$"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, consensus_every=0), "consensus_every 0: must be an integer >= 1"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, consensus_every=5), "consensus_every needs log_dir"),
    # found when the run ended, after the training, with a traceback
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, trace="/nonexistent/dir/t.json"),
     "^HopOptimizer: trace /nonexistent/dir/t.json: cannot write a file there$"),
    (dict(optimizer_class=torch.optim.SGD, lr=0.1, tensorboard="/proc/hopdec-tb"),
     "^HopOptimizer: tensorboard /proc/hopdec-tb: cannot create it"),
])
def test_bad_arguments_are_one_line_errors(kwargs, match):
    m = net()
    params = kwargs.pop("params", m)
    if params == "list":
        params = list(m.parameters())
    with pytest.raises((ConfigError, TypeError), match=match):
        HopOptimizer(params, **kwargs)


def test_float64_is_refused_and_a_cast_afterwards_is_named(finish_all):
    with pytest.raises(ConfigError, match=r"0.weight is torch.float64.*float32"):
        HopOptimizer(net().double(), torch.optim.SGD, lr=0.1)
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1)
    finish_all.append(opt)
    train(m, opt, 1)
    m.double()
    with pytest.raises(ConfigError, match=r"0.weight was cast to torch.float64 .*model.double"):
        opt.step()
    m.float()


def test_a_buffer_average_buffers_cannot_hold_is_named_as_a_buffer_with_the_way_out():
    """A bfloat16 buffer with ``average_buffers=True`` was refused as if it were a parameter ("build the model
    in float32"); the way to keep it bfloat16 is not to average buffers (the consensus model still does)."""
    m = net()
    m.register_buffer("scale", torch.ones(2, dtype=torch.bfloat16))
    with pytest.raises(ConfigError) as err:
        HopOptimizer(m, torch.optim.SGD, lr=0.1, average_buffers=True)
    assert re.fullmatch(r"HopOptimizer: buffer scale is torch\.bfloat16: average_buffers=True averages float32 "
                        r"buffers .*average_buffers=False .*", str(err.value)), str(err.value)


def test_an_exception_carrying_a_workers_traceback_is_one_line_with_its_own_cause():
    """A DataLoader worker's exception is re-raised in the loop with the worker's whole traceback in its
    message: the job's one line held that traceback flattened (frames, carets, 700 characters); it says
    what was caught, the worker's own exception and the line that raised it."""
    from torch._utils import ExceptionWrapper

    from hopdec.optim import failing
    from hopdec.runtime.failures import cause

    def load(i):                                         # a Dataset.__getitem__, run in worker process 0
        raise ValueError(f"corrupt sample {i}")
    try:
        load(37)
    except ValueError:
        wrapped = ExceptionWrapper(sys.exc_info(), where="in DataLoader worker process 0")
    try:
        wrapped.reraise()                                # what DataLoader's iterator does with it
    except ValueError as err:
        raised, tb = err, err.__traceback__
    assert "Traceback" in str(raised)
    line = str(failing.as_one_line(raised, tb))
    assert re.fullmatch(r"ValueError: Caught ValueError in DataLoader worker process 0: ValueError: corrupt sample "
                        r"37 \(raised at test_optim\.py:\d+\) \(at test_optim\.py:\d+; HOPDEC_DEBUG=1 shows the "
                        r"traceback\)", line), line
    assert re.fullmatch(r"ValueError: Caught ValueError in DataLoader worker process 0: ValueError: corrupt sample "
                        r"37 \(raised at test_optim\.py:\d+\)( \(HOPDEC_DEBUG=1 shows the traceback\))?",
                        cause(raised)), cause(raised)


def test_replaced_parameters_are_followed(finish_all):
    """``load_state_dict(assign=True)`` puts new tensors into the model: the optimizer adopts them (their
    values, its groups and state follow), so training goes on changing the model."""
    m = net()
    opt = HopOptimizer(m, torch.optim.Adam, lr=0.05)
    finish_all.append(opt)
    train(m, opt, 2)
    loaded = {k: v.clone() + 1.0 if v.is_floating_point() else v.clone() for k, v in m.state_dict().items()}
    m.load_state_dict(loaded, assign=True)
    new = m[0].weight
    assert opt.param_groups[0]["params"][0] is not new
    train(m, opt, 1)
    assert opt.param_groups[0]["params"][0] is new and new in opt.state
    assert not torch.equal(new.detach(), loaded["0.weight"])          # still trained
    assert new.data_ptr() == opt.flat.values().data_ptr()             # back in the flat buffer
    m[2].bias.data = torch.zeros(2)                                   # p.data = ...: followed too
    train(m, opt, 1)
    assert m[2].bias.untyped_storage().data_ptr() == opt.flat.values().untyped_storage().data_ptr()


@pytest.mark.parametrize("how", ["data", "set_", "buffer"])
def test_a_storage_replaced_between_steps_keeps_its_values(how, finish_all):
    """``p.data = t`` or ``p.set_(t)`` between steps (the same tensor, another storage) was undone: the
    values went into the foreign storage and the next step re-pointed the tensor at the buffer's old ones."""
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.0, average_buffers=True)
    finish_all.append(opt)
    train(m, opt, 1)
    t = m[1].running_mean if how == "buffer" else m[0].weight
    seven = torch.full_like(t, 7.0)
    with torch.no_grad():
        t.set_(seven.clone()) if how == "set_" else setattr(t, "data", seven.clone())
    opt.step()
    t = m[1].running_mean if how == "buffer" else m[0].weight
    assert torch.equal(t.detach(), seven)
    assert t.untyped_storage().data_ptr() == opt.flat.values().untyped_storage().data_ptr()


def test_consensus_model_on_one_rank_is_the_model_with_buffers(finish_all):
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1)
    finish_all.append(opt)
    train(m, opt, 3)
    twin = opt.consensus_model()
    for (k, a), b in zip(m.state_dict().items(), twin.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    assert twin[0].weight.data_ptr() != m[0].weight.data_ptr()        # a copy to evaluate or save


def test_flat_adamw_steps_exactly_as_torch_adamw():
    """``hopdec train``'s AdamW (no torch._dynamo import at start-up) gives torch.optim.AdamW's parameters
    bit for bit, and keeps its state where checkpoints read it."""
    from hopdec.ml.trainer import FlatAdamW
    g = torch.Generator().manual_seed(0)
    a = torch.nn.Parameter(torch.randn(1000, generator=g))
    b = torch.nn.Parameter(a.detach().clone())
    ours = FlatAdamW([a], lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    ref = torch.optim.AdamW([b], lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01, foreach=False)
    for k in range(6):
        grad = torch.randn(1000, generator=g)
        a.grad, b.grad = grad.clone(), grad.clone()
        ours.param_groups[0]["lr"] = ref.param_groups[0]["lr"] = 3e-3 * (k + 1) / 6
        ours.step()
        ref.step()
        assert torch.equal(a, b), k
    assert torch.equal(ours.state[a]["exp_avg_sq"], ref.state[b]["exp_avg_sq"])


def test_the_transformer_trainer_schedules_clips_and_checkpoints():
    from hopdec.ml.data import load_dataset, partition
    from hopdec.ml.trainer import LocalTrainer, LRSchedule
    s = LRSchedule(warmup=10, horizon=100, min_ratio=0.1)
    assert s(0) == pytest.approx(0.1) and s(9) == pytest.approx(1.0) and s(10) == pytest.approx(1.0)
    assert s(55) == pytest.approx(0.55) and s(100) == pytest.approx(0.1) and s(500) == pytest.approx(0.1)
    d = load_dataset("kjv")
    t = LocalTrainer("transformer", d, partition(d.train_y, 4, 0), lr=3e-3, momentum=0.9, weight_decay=0.01,
                     batch_size=4, iterations=40)
    assert type(t.optimizer).__name__ == "FlatAdamW" and t.clip == 1.0
    losses = []
    for k in range(6):
        losses.append(t.compute())
        assert float(torch.linalg.vector_norm(t.flat.grad)) <= 1.0 + 1e-4
        t.apply(k)
    assert t.optimizer.param_groups[0]["lr"] == pytest.approx(3e-3 * t.schedule(5))
    assert losses[-1] < losses[0] and t.schedule.warmup == 10
    state = t.state()
    assert {"params", "adam/exp_avg", "adam/exp_avg_sq", "adam/step"} <= set(state)
    u = LocalTrainer("transformer", d, partition(d.train_y, 4, 0), lr=3e-3, momentum=0.9, weight_decay=0.01,
                     batch_size=4, iterations=40, seed=5)
    u.load_state(state)
    assert torch.equal(u.flat, t.flat)
    assert torch.equal(u.optimizer.state[u.flat]["exp_avg"], t.optimizer.state[t.flat]["exp_avg"])
    assert float(u.optimizer.state[u.flat]["step"]) == 6.0


def test_the_transformer_is_causal_with_tied_weights():
    from hopdec.ml.models import build_model
    torch.manual_seed(0)
    m = build_model("transformer", (16,), 256)
    assert m.head.weight is m.tok.weight
    names = [n for n, _ in m.named_parameters()]
    assert "head.weight" not in names                                 # one parameter, counted once
    x = torch.randint(0, 256, (2, 16))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 256                                 # change the future only
    a, b = m(x), m(y)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])
    with pytest.raises(ConfigError, match="token sequences"):
        build_model("transformer", (1, 8, 8), 10)


def test_the_corpus_splits_by_chapter_and_windows_predict_the_next_byte():
    from hopdec.ml.data import load_dataset, partition
    from hopdec.ml.text import decode, read_corpus, split_chapters
    text = read_corpus("kjv")
    assert text.startswith("Genesis 1\n1 In the beginning God created the heaven and the earth.")
    assert len(text) == 4_234_844
    train, val = split_chapters(text)
    assert val.startswith("Genesis 40\n") and "Genesis 40\n" not in train
    d = load_dataset("kjv")
    assert d.input_shape == (128,) and d.num_classes == 256 and len(d.test_y) == 769
    x, y = d.train_x[torch.tensor([3, 7])], d.train_y[torch.tensor([3, 7])]
    assert x.shape == (2, 128) and torch.equal(x[:, 1:], y[:, :-1])
    assert decode(d.train_x[0][:9]) == "Genesis 1"
    parts = [partition(d.train_y, 4, p, "noniid", 0) for p in range(4)]
    assert sorted(torch.cat(parts).tolist()) == list(range(len(d.train_y)))
    assert parts[0].max() < parts[1].min()                            # noniid: contiguous stretches of text


def test_an_optimizer_already_built_can_be_wrapped(finish_all):
    """Horovod/BlueFog style: the user's own optimizer (its groups and state kept), plus the model."""
    m = net()
    inner = torch.optim.Adam([{"params": m[0].parameters(), "lr": 0.02}, {"params": m[2].parameters()}], lr=0.01)
    opt = HopOptimizer(inner, model=m)
    finish_all.append(opt)
    assert opt.optimizer is inner and opt.param_groups is inner.param_groups
    train(m, opt, 2)
    assert m[0].weight in inner.state and inner.state[m[0].weight]["step"] == 2
    with pytest.raises(ConfigError, match="already built.*lr"):
        HopOptimizer(torch.optim.SGD(net().parameters(), lr=0.1), lr=0.2)


def test_hopdec_train_offers_the_registry_s_models_and_datasets():
    from hopdec.cli.train import build_parser
    from hopdec.ml.registry import DATASETS, MODELS
    args = build_parser().parse_args(["--dataset", "kjv", "--model", "transformer"])
    assert (args.dataset, args.model) == ("kjv", "transformer")
    assert "kjv" in DATASETS and "transformer" in MODELS
    from hopdec.cli.train import parse
    with pytest.raises(ConfigError, match="--model 'resnet': expected one of cnn, vgg11, svm, mlp, transformer"):
        parse(["--model", "resnet"])


# ---- sys.exit with a failure status (hopdec.optim.failing; the MPI job: test_optim_mpi.py) ----

@pytest.mark.parametrize("status, code", [(None, 0), (0, 0), (False, 0), (1, 1), (True, 1), (7, 7),
                                          ("Loss is nan", 1), ([1], 1)])
def test_the_exit_code_of_a_system_exit_is_pythons(status, code):
    from hopdec.optim.failing import exit_code
    assert exit_code(status) == code


def test_a_failing_sys_exit_is_noted_with_its_line_until_the_next_step():
    from hopdec.optim import failing
    seen = []
    watched = failing._WatchedExit(lambda status=None: seen.append(status), "sys.exit")
    failing.resumed()
    watched(0)                                  # a rank done early: nothing noted
    assert failing.failed_exit() is None
    watched("Loss is nan"); line = sys._getframe().f_lineno
    code, err = failing.failed_exit()
    assert code == 1 and str(err) == (f"sys.exit('Loss is nan') (at test_optim.py:{line}): "
                                      "the rank exits with a failure status")
    assert seen == [0, "Loss is nan"]           # the real exit is still what runs
    failing.resumed()                           # the loop went on: the SystemExit was caught
    assert failing.failed_exit() is None


def test_a_failing_system_exit_in_flight_is_seen_by_a_finish_it_passes_through():
    from hopdec.optim import failing
    failing.resumed()
    try:
        raise SystemExit(300)
    except SystemExit as e:
        code, err = failing.failed_exit(e)
    assert code == 300 & 0xFF and str(err).startswith("SystemExit(300) (at test_optim.py:")
    assert failing.failed_exit(SystemExit(0)) is None and failing.failed_exit(SystemExit()) is None
    assert failing.failed_exit(ValueError("x")) is None       # exceptions: the excepthook's
    assert failing.failed_exit(None) is None


@pytest.mark.parametrize("named, code, said", [("SIGTERM\n", 143, "SIGTERM to the launcher; "),
                                                ("SIGFOO", 130, "SIGFOO to the launcher; "),
                                                ("", 130, ""), ("rm -rf /", 130, "")])
def test_an_uncaught_interrupt_is_one_stopped_line_with_the_launchers_signal(tmp_path, monkeypatch, named,
                                                                             code, said):
    """The line and exit code of a KeyboardInterrupt nobody caught in a user's loop (the job:
    test_launch.py): 128 + the signal the launch script wrote into its stop file, 130 without one; only a
    signal's name is read from the file."""
    from hopdec.optim import failing
    stop = tmp_path / "stop"
    stop.write_text(named)
    monkeypatch.setenv("HOPDEC_STOP_FILE", str(stop))
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as e:
        line = sys._getframe().f_lineno - 2
        got, err = failing.stopped(e.__traceback__)
    assert got == code and str(err) == f"KeyboardInterrupt ({said}at test_optim.py:{line})"


def test_sigusr1_becomes_a_keyboard_interrupt_unless_the_script_handles_it():
    """The launch scripts' stop (SIGUSR1) is Ctrl-C's KeyboardInterrupt in a user's script; a handler of
    the script's own is kept."""
    import signal
    from hopdec.optim import failing
    before = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        failing._stop_as_interrupt()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGUSR1)
        def own(signum, frame):
            pass
        signal.signal(signal.SIGUSR1, own)
        failing._stop_as_interrupt()
        assert signal.getsignal(signal.SIGUSR1) is own
    finally:
        signal.signal(signal.SIGUSR1, before)


@pytest.mark.parametrize("start", ["import hopdec.optim",
                                   "from hopdec.runtime import interrupt; interrupt.install()"],
                         ids=["loop", "train"])
def test_the_launchers_stop_arriving_as_the_process_exits_is_ignored(start):
    """A stop (SIGUSR1) that reaches a rank once its program is done: a user's loop that ended as SIGTERM
    reached the launcher died in MPI_Finalize "on signal 10" (Python's finalization had reset the handler to
    the default, which ends the process; found by the loop-resume failure campaign). Now ignored from
    hopdec's exit handler on: an exit handler registered earlier (it runs later, as MPI_Finalize does)
    sees it ignored and the process exits 0, quietly."""
    import subprocess
    script = ("import atexit, os, signal\n"
              "def late():\n"
              "    print('ignored', signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN, flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGUSR1)\n"
              "    print('alive', flush=True)\n"
              "atexit.register(late)\n" + start + "\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "ignored True\nalive\n", ""), r


def test_a_lazy_module_not_yet_run_is_one_line_naming_the_parameter():
    model = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"^HopOptimizer: 0\.weight is not initialized yet .*forward pass"):
        HopOptimizer(model, torch.optim.SGD, lr=0.1)
    model(torch.randn(2, 5))                    # after one forward it is an ordinary model
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.1)
    assert opt.flat.numel == 5 * 4 + 4 + 4 * 2 + 2
    opt.finish()


def conv_net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 2)).to(memory_format=torch.channels_last)


def train_images(model, opt, steps, start=0):
    for k in range(start, start + steps):
        g = torch.Generator().manual_seed(k)
        x = torch.randn(4, 3, 6, 6, generator=g).to(memory_format=torch.channels_last)
        opt.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("local_steps", [1, 2])
def test_a_channels_last_model_stays_channels_last_and_trains_as_a_contiguous_one(finish_all, local_steps):
    """``model.to(memory_format=torch.channels_last)`` (PyTorch's recipe for faster convolutions) keeps its
    layout in the flat buffer: each parameter is a view with the strides it had, not a contiguous one (which
    silently undid the user's choice), and every reader of the buffer (Reduce, local rounds, gradients, the
    consensus model) agrees on it, so it trains as the same model in the default layout does."""
    m, ref_m = conv_net(), conv_net().to(memory_format=torch.contiguous_format)
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1, momentum=0.9, local_steps=local_steps)
    ref = HopOptimizer(ref_m, torch.optim.SGD, lr=0.1, momentum=0.9, local_steps=local_steps)
    finish_all.extend([opt, ref])
    w = m[0].weight
    assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
    train_images(m, opt, 4)
    train_images(ref_m, ref, 4)
    assert m[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert m[0].weight.grad.is_contiguous(memory_format=torch.channels_last)
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    twin = opt.consensus_model()
    for (k, a), b in zip(m.state_dict().items(), twin.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    opt.zero_grad(set_to_none=True)          # backward makes new gradients; they go back into the buffer
    ref.zero_grad(set_to_none=True)
    train_images(m, opt, 1, start=4)
    train_images(ref_m, ref, 1, start=4)
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_tensorboard_scalars_from_a_users_loop(tmp_path, finish_all):
    """``tensorboard=DIR``: the scalars ``hopdec train --tensorboard`` writes, one run per rank."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1, tensorboard=str(tmp_path / "tb"))
    train(m, opt, 4)
    opt.finish()
    acc = EventAccumulator(str(tmp_path / "tb" / "rank0"))
    acc.Reload()
    assert [s.step for s in acc.Scalars("loss")] == [0, 1, 2, 3]


def test_a_log_dir_holding_an_earlier_run_is_refused_unless_overwrite(tmp_path):
    """As ``hopdec train --log-dir``: a second run into the same directory replaced the first's rank files
    one by one, and left those of ranks it did not have, which ``hopdec report`` then merged with the new
    run's as one run. Now it is refused, ``overwrite=True`` replaces them, and every header says its run."""
    def run(**kw):
        m = net()
        opt = HopOptimizer(m, torch.optim.SGD, lr=0.1, log_dir=str(tmp_path), **kw)
        train(m, opt, 2)
        opt.finish()
        return json.loads(open(tmp_path / "rank0.jsonl").readline())["run"]["run_id"]
    first = run()
    (tmp_path / "rank3.jsonl").write_text(open(tmp_path / "rank0.jsonl").read())   # a wider earlier run's
    with pytest.raises(ConfigError, match=r"^HopOptimizer: log_dir .*: holds the logs of an earlier run \(rank0.jsonl, "
                                          r"rank3.jsonl\); give a new directory, or overwrite=True to replace them; "
                                          r"a resumed run continues them when it loads a state_dict\(\) saved "
                                          r"with them$"):
        run()
    second = run(overwrite=True)
    assert second != first and sorted(os.listdir(tmp_path)) == ["rank0.jsonl"]


def test_a_refused_output_leaves_no_log_that_refuses_the_next_try(tmp_path, finish_all):
    """Every output is checked before any is written: a refused ``trace`` left ``rank0.jsonl`` behind, and
    the corrected script was then refused for "the logs of an earlier run"."""
    m = net()
    with pytest.raises(ConfigError, match="trace /nonexistent/dir/t.json"):
        HopOptimizer(m, torch.optim.SGD, lr=0.1, log_dir=str(tmp_path / "logs"), trace="/nonexistent/dir/t.json")
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1, log_dir=str(tmp_path / "logs"))
    finish_all.append(opt)


def test_a_resumed_loop_continues_its_log(tmp_path):
    """As ``hopdec train --resume``: a loop that loads a state dict saved while it logged to the same
    log_dir continues its logs, cut back to where they stood at the save (the iterations after it, lost
    with the process, are logged again once); the report reads one run of 8 iterations. Before: refused as
    "an earlier run's logs", or with overwrite=True the first part was lost."""
    from hopdec.report.data import Run
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1, log_dir=str(tmp_path), consensus_every=2)
    train(m, opt, 5)
    ck = {"m": m.state_dict(), "o": opt.state_dict()}
    train(m, opt, 2, start=5)               # logged, then lost: the process dies before the next save
    opt.finish()
    m2 = net(7)
    opt2 = HopOptimizer(m2, torch.optim.SGD, lr=0.1, log_dir=str(tmp_path), consensus_every=2)
    m2.load_state_dict(ck["m"])
    opt2.load_state_dict(ck["o"])
    train(m2, opt2, 3, start=5)
    opt2.finish()
    lines = [json.loads(x) for x in open(tmp_path / "rank0.jsonl")]
    heads = [x["run"] for x in lines if "run" in x]
    assert len(heads) == 2 and "resumed_from" not in heads[0] and heads[1]["resumed_from"] == 5
    iters = [x["iter"] for x in lines if "iter" in x]
    assert iters == list(range(8)), iters
    rounds = [x["at"] for x in lines if x.get("event") == "consensus"]      # each once (before: 2, 4 again)
    assert rounds == [2, 4, 6, 8], rounds
    assert sorted(Run.load(str(tmp_path)).records[0][i]["iter"] for i in range(8)) == list(range(8))
    # a state dict saved with other logs (or none) does not continue these: refused as an earlier run's
    m3 = net()
    opt3 = HopOptimizer(m3, torch.optim.SGD, lr=0.1, log_dir=str(tmp_path))
    opt3.load_state_dict(dict(ck["o"], hop=dict(ck["o"]["hop"], log=str(tmp_path / "elsewhere.jsonl"))))
    with pytest.raises(ConfigError, match="holds the logs of an earlier run"):
        train(m3, opt3, 1, start=5)
    assert iters == [x["iter"] for x in map(json.loads, open(tmp_path / "rank0.jsonl")) if "iter" in x]


def test_a_stop_signal_with_local_steps_names_the_round_not_an_iteration():
    """With local_steps the stop's line said "every rank stops at iteration 3" where 3 counts rounds (6
    inner steps, the mini-batches the user's loop counts): it names the round and its inner steps."""
    import signal
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1, local_steps=2)
    train(m, opt, 2)
    os.kill(os.getpid(), signal.SIGUSR1)
    with pytest.raises(KeyboardInterrupt, match=r"^every rank stops at round (\d+) \((\d+) inner steps, rounds "
                                                r"of local_steps=2\)$") as e:
        train(m, opt, 20, start=2)
    r, inner = map(int, re.match(r"every rank stops at round (\d+) \((\d+)", e.value.args[0]).groups())
    assert inner == 2 * r and r == opt.iteration
    opt.finish()


def test_a_stop_signal_ends_the_loop_at_the_agreed_iteration_and_a_second_one_at_once():
    """(hopdec.optim.stopping; the ranks' agreement is under mpirun in test_optim_mpi.) One rank: the stop
    is one past the position where the rank agreed it (its next step()); after it step() says so; a second signal raises at
    once; a later optimizer in the process starts without the request."""
    import signal
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1)
    train(m, opt, 3)
    os.kill(os.getpid(), signal.SIGUSR1)                # a request: nothing raised here
    with pytest.raises(KeyboardInterrupt, match="every rank stops at iteration 5"):
        train(m, opt, 5, start=3)
    assert opt.iteration == opt.state_dict()["hop"]["position"] == 5
    with pytest.raises(RuntimeError, match="after the stop at iteration 5"):
        train(m, opt, 1, start=5)
    with pytest.raises(KeyboardInterrupt):              # the second signal: at once
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(100):
            time.sleep(0.01)
    opt.finish()
    m2 = net()
    opt2 = HopOptimizer(m2, torch.optim.SGD, lr=0.1)
    train(m2, opt2, 4)                                  # not stopped by the first optimizer's request
    opt2.finish()
    assert opt2.iteration == 4


def test_skipping_that_never_skips_is_refused_and_the_notes_train_prints_are_warnings(finish_all):
    """``skip`` without backup workers or staleness >= 1 never jumps (``hopdec train`` refuses it too); and
    the notes ``hopdec train`` prints about settings that work but not as one may expect (here a max-jump
    above max_ig) were dropped by the optimizer: nothing said."""
    with pytest.raises(ConfigError, match=r"^HopOptimizer: skip max-jump=3,trigger=2: never skips without "
                                          r"backup_workers or staleness >= 1"):
        HopOptimizer(net(), torch.optim.SGD, lr=0.1, skip="max-jump=3")
    with pytest.warns(UserWarning, match=r"^HopOptimizer: skip max-jump=4 > max_ig 2: a jump never passes"):
        opt = HopOptimizer(net(), torch.optim.SGD, lr=0.1, staleness=1, skip="max-jump=4")
    finish_all.append(opt)


@pytest.mark.parametrize("every", [0, -4, True, "4", 2.0])
def test_checkpoint_every_is_a_number_of_iterations(every):
    with pytest.raises(ConfigError, match=r"^HopOptimizer: checkpoint_every .*: must be an integer >= 1 "
                                          r"\(iterations\), or None$"):
        HopOptimizer(net(), torch.optim.SGD, lr=0.1, checkpoint_every=every)


def test_checkpoint_every_1_with_skipping_is_refused_and_checkpoint_due_follows_the_iterations(finish_all):
    """Every iteration a checkpoint iteration: no jump could ever be made (as ``hopdec train`` refuses
    ``--skip`` with ``--checkpoint-every 1``). One rank alone: due at each multiple of K after a step, at the
    start of its round with local steps; never without ``checkpoint_every``; the latest common checkpoint
    is its own latest."""
    with pytest.raises(ConfigError, match=r"^HopOptimizer: skip max-jump=2,trigger=2: never skips with "
                                          r"checkpoint_every 1"):
        HopOptimizer(net(), torch.optim.SGD, lr=0.1, staleness=1, skip="max-jump=2", checkpoint_every=1)
    for kw, due in (({}, []), (dict(checkpoint_every=3), [3, 6]), (dict(checkpoint_every=2, local_steps=2), [2])):
        model = net()
        opt = HopOptimizer(model, torch.optim.SGD, lr=0.1, **kw)
        finish_all.append(opt)
        assert not opt.checkpoint_due                   # (before the first step)
        seen = []
        for _ in range(7):
            model(torch.randn(4, 4)).sum().backward()
            opt.step()
            if opt.checkpoint_due:
                seen.append(opt.iteration)
        assert seen == due, (kw, seen)
    with pytest.raises(RuntimeError, match=r"^HopOptimizer: common_checkpoint\(\) after the first step"):
        opt.common_checkpoint([2])
    opt = HopOptimizer(net(), torch.optim.SGD, lr=0.1, checkpoint_every=2)
    finish_all.append(opt)
    assert opt.common_checkpoint([4, 2, 6]) == 6 and opt.common_checkpoint([]) is None


@pytest.mark.parametrize("cls", ["HopOptimizer", "HopSGD"])
def test_a_warning_points_at_the_users_line(cls, finish_all):
    """A warning names the line of the user's script that built the optimizer (HopSGD's pointed into
    hop.py, a first step's into torch's wrappers)."""
    import warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opt = (HopOptimizer(net(), torch.optim.SGD, lr=0.1, staleness=1, skip="max-jump=4") if cls == "HopOptimizer"
               else HopSGD(net(), lr=0.1, staleness=1, skip="max-jump=4"))
    finish_all.append(opt)
    notes = [w for w in seen if "max-jump=4" in str(w.message)]
    assert [os.path.basename(w.filename) for w in notes] == ["test_optim.py"], [(w.filename, w.lineno) for w in notes]


def frozen_backbone(seed=0, sparse=False):
    """A fine-tuning model: a frozen embedding (``sparse`` for SparseAdam) and a trainable head."""
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Embedding(20, 6, sparse=sparse), torch.nn.Flatten(), torch.nn.Linear(18, 2))
    return m


def train_zero_grad_after(model, opt, steps, set_to_none=True):
    """The other common loop: backward, step, then zero_grad (pytorch/examples' ImageNet loop zeroes first;
    many scripts zero after, or with set_to_none=False)."""
    for k in range(steps):
        g = torch.Generator().manual_seed(k)
        x = torch.randint(0, 20, (8, 3), generator=g)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_parameters_without_a_gradient_are_left_alone_as_torch_leaves_them(finish_all, set_to_none):
    """A frozen layer given to the optimizer (``AdamW(model.parameters())`` with ``requires_grad=False``
    layers, the torch idiom) has no gradient: torch skips it. The flat buffer gave every parameter a zero
    ``.grad`` view, so a loop that zeroes after the step stepped it with a zero gradient: AdamW's weight
    decay shrank the frozen layer at the first step (at every step with ``set_to_none=False``)."""
    a, b = frozen_backbone(), frozen_backbone()
    for m in (a, b):
        m[0].weight.requires_grad_(False)
    frozen = a[0].weight.detach().clone()
    opt = HopOptimizer(a.parameters(), torch.optim.AdamW, model=a, lr=0.01, weight_decay=0.1)
    finish_all.append(opt)
    ref = torch.optim.AdamW(b.parameters(), lr=0.01, weight_decay=0.1)
    assert all(p.grad is None for p in a.parameters())
    train_zero_grad_after(a, opt, 3, set_to_none)
    train_zero_grad_after(b, ref, 3, set_to_none)
    assert torch.equal(a[0].weight, frozen) and a[0].weight.grad is None
    assert a[0].weight not in opt.state                       # never stepped, as in torch
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_sparse_gradients_reach_sparse_adam_in_a_loop_that_zeroes_after_the_step(finish_all):
    """``nn.Embedding(sparse=True)`` with SparseAdam: the first backward added its sparse gradient to the
    zero dense ``.grad`` the buffer had given the weight, and SparseAdam refused the dense sum ("SparseAdam
    does not support dense gradients")."""
    a, b = frozen_backbone(sparse=True), frozen_backbone(sparse=True)
    opt = HopOptimizer(list(a[0].parameters()), torch.optim.SparseAdam, model=a, lr=0.01)
    finish_all.append(opt)
    ref = torch.optim.SparseAdam(list(b[0].parameters()), lr=0.01)
    train_zero_grad_after(a, opt, 3)
    train_zero_grad_after(b, ref, 3)
    assert torch.equal(a[0].weight, b[0].weight)


def test_gradients_the_parameters_had_before_the_optimizer_was_built_are_kept(finish_all):
    """A gradient computed before the optimizer is built (a first backward to size things, or gradient
    accumulation started before it) is kept, as a torch optimizer built then would see it: the buffer
    replaced it by zeros."""
    a, b = net(), net()
    for m in (a, b):
        m(torch.ones(4, 4)).sum().backward()
    opt = HopOptimizer(a, torch.optim.SGD, lr=0.1)
    finish_all.append(opt)
    ref = torch.optim.SGD(b.parameters(), lr=0.1)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
    opt.step()
    ref.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("local_steps", [1, 2])
def test_an_exception_in_the_closure_is_raised_by_step_and_the_loop_can_go_on(finish_all, local_steps):
    """A closure that raises (an out-of-memory a loop catches to skip the batch, as many scripts do): torch
    raises it from step() and has not stepped; the loop goes on. The exception ended the worker loop's
    generator inside its ApplyGradient, so the next step() raised a bare StopIteration (one line ending
    the job under mpirun, naming nothing). Now step() raises the closure's exception, the iteration goes
    through without a gradient step, and training continues as torch's does."""
    a, b = net(), net()
    opt = HopOptimizer(a, torch.optim.Adam, lr=0.01, local_steps=local_steps, outer_optimizer="sgd")
    finish_all.append(opt)                                  # (the plain outer step: torch's steps on one rank)
    ref = torch.optim.Adam(b.parameters(), lr=0.01)
    for k in range(6):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(k))
        for m, o in ((a, opt), (b, ref)):
            def closure():
                o.zero_grad()
                loss = (m(x) ** 2).mean()
                if k == 3:
                    raise RuntimeError("out of memory: skip this batch")
                loss.backward()
                return loss
            try:
                assert float(o.step(closure).detach()) > 0
            except RuntimeError as err:
                assert k == 3 and str(err) == "out of memory: skip this batch"
    for p, q in zip(a.parameters(), b.parameters()):       # (a round's end adds w - a to x_bar: rounding)
        torch.testing.assert_close(p, q, rtol=0, atol=0 if local_steps == 1 else 1e-6)
    assert opt.state[a[0].weight]["step"] == ref.state[b[0].weight]["step"] == 5


def test_a_state_dict_refused_leaves_the_optimizer_as_it_was_and_a_plain_one_starts_at_zero(finish_all):
    """``load_state_dict`` of another rank's state dict (the DDP habit: rank 0 saves, every rank loads) is
    refused -- but the wrapped optimizer had loaded it first, so a loop that caught the error and went on
    trained with rank 0's moments. And a plain torch state dict loaded after a Hop one (starting over
    from a single-process run) kept the earlier position, though a plain one means position 0."""
    m = net()
    opt = HopOptimizer(m, torch.optim.Adam, lr=0.01)
    train(m, opt, 3)
    saved = opt.state_dict()
    opt.finish()
    other = dict(saved, hop=dict(saved["hop"], rank=1, ranks=2))
    m2 = net()
    opt2 = HopOptimizer(m2, torch.optim.Adam, lr=0.01)
    finish_all.append(opt2)
    with pytest.raises(ConfigError, match="saved by rank 1 of 2; this is rank 0 of 1"):
        opt2.load_state_dict(other)
    assert opt2.optimizer.state_dict()["state"] == {} and opt2.iteration == 0
    opt2.load_state_dict(saved)
    assert opt2.iteration == 3
    plain = torch.optim.Adam(net().parameters(), lr=0.01)
    train(net(), plain, 0)
    opt2.load_state_dict(plain.state_dict())
    assert opt2.iteration == 0 and opt2.optimizer.state_dict()["state"] == {}
    train(m2, opt2, 2)
    assert opt2.iteration == 2


def test_a_layer_unfrozen_after_the_optimizer_was_built_from_the_model_is_one_line(finish_all):
    """Gradual unfreezing: ``HopOptimizer(model, ...)`` (the README's port of ``AdamW(model.parameters())``)
    took the parameters that required a gradient then; a layer unfrozen later got gradients that nothing
    stepped -- torch's optimizer trains it, this one silently did not. Now the step names it and the way;
    built from every parameter (frozen ones have no gradient: not stepped), unfreezing trains it."""
    m = net()
    m[0].weight.requires_grad_(False)
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1)
    finish_all.append(opt)
    train(m, opt, 2)
    m[0].weight.requires_grad_(True)
    with pytest.raises(ConfigError, match=r"^HopOptimizer: 0\.weight has a gradient but is not trained: it had "
                                          r"requires_grad=False when HopOptimizer\(model, \.\.\.\) was built"):
        train(m, opt, 1, start=2)
    m2 = net()
    m2[0].weight.requires_grad_(False)
    opt2 = HopOptimizer(m2.parameters(), torch.optim.SGD, model=m2, lr=0.1)
    finish_all.append(opt2)
    frozen = m2[0].weight.detach().clone()
    train(m2, opt2, 2)
    assert torch.equal(m2[0].weight, frozen)
    m2[0].weight.requires_grad_(True)
    train(m2, opt2, 1, start=2)
    assert not torch.equal(m2[0].weight, frozen)


def test_a_compiled_function_that_steps_runs_the_step_eagerly(finish_all):
    """PyTorch's "compiling the optimizer" recipe -- ``torch.compile`` around a function that calls
    ``opt.step()`` -- and a whole compiled train step: Dynamo traced into hopdec and failed on the
    buffer's host arrays ("'ndarray' object has no attribute 'data_ptr'"). The step now runs eagerly
    inside the compiled function, as torch's own zero_grad does, and trains as torch.optim.Adam."""
    a, b = net(), net()
    opt = HopOptimizer(a, torch.optim.Adam, lr=0.01)
    finish_all.append(opt)
    ref = torch.optim.Adam(b.parameters(), lr=0.01)

    def train_step(m, o, x):
        o.zero_grad()
        (m(x) ** 2).mean().backward()
        o.step()
    compiled = torch.compile(train_step, backend="eager")
    for k in range(3):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(k))
        compiled(a, opt, x)
        train_step(b, ref, x)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    assert opt.iteration == 3


@pytest.mark.parametrize("saved_kw, loaded_kw, words", [
    (dict(local_steps=3), dict(), "saved with local_steps=3; this optimizer has local_steps=1"),
    (dict(local_steps=3), dict(local_steps=3, outer_optimizer="sgd"), "saved with outer_optimizer='nesterov', "
     "outer_lr=0.7, outer_momentum=0.9; this optimizer has outer_optimizer='sgd', outer_lr=1.0"),
    (dict(local_steps=3, outer_optimizer="sgd"), dict(local_steps=3, outer_lr=0.5), "outer_momentum=0.0; this "
     "optimizer has outer_optimizer='nesterov', outer_lr=0.5"),
    (dict(), dict(local_steps=1, outer_optimizer="nesterov"), "saved with outer_optimizer='sgd', outer_lr=1.0"),
])
def test_a_state_dict_of_other_rounds_is_refused_before_anything_is_loaded(finish_all, saved_kw, loaded_kw, words):
    """A state dict saved mid-round of local_steps=3 (position 1 = one round, two inner steps taken, the
    round's anchor) loaded into local_steps=1 was taken silently as iteration 1, the anchor dropped; a
    different outer step dropped the saved outer momentum (or started it from zero). ``hopdec train
    --resume`` refuses both; so does the optimizer, before loading anything."""
    m = net()
    opt = HopOptimizer(m, torch.optim.SGD, lr=0.1, momentum=0.9, **saved_kw)
    train(m, opt, 5)
    saved = opt.state_dict()
    opt.finish()
    m2 = net()
    opt2 = HopOptimizer(m2, torch.optim.SGD, lr=0.1, momentum=0.9, **loaded_kw)
    finish_all.append(opt2)
    with pytest.raises(ConfigError, match=re.escape(words)):
        opt2.load_state_dict(saved)
    assert opt2.iteration == 0 and opt2.optimizer.state_dict()["state"] == {}
    same = HopOptimizer(net(), torch.optim.SGD, lr=0.1, momentum=0.9, **saved_kw)
    finish_all.append(same)
    same.load_state_dict(saved)                            # the same settings: loaded
    assert same.iteration == (1 if saved_kw else 5)


def test_paused_notes_answer_each_paused_neighbour_once_and_only_after_sending_its_iteration():
    """The serial graph's notes (hopdec.optim.ending): NEED k goes to an in-neighbour paused at k only once
    this rank has sent update k, once; a rank serves k only when asked for k or later; PAUSED k is said
    once per iteration."""
    from hopdec.optim.ending import PausedNotes
    notes = PausedNotes()
    notes.heard({1: 4, 2: 6}, {})
    notes.heard({1: 3}, {})                         # an older note changes nothing
    assert notes.answers(last_sent=3) == []         # (not sent 4 yet: it may be paused at 4 too)
    assert notes.answers(last_sent=4) == [(1, 4)] and notes.answers(last_sent=4) == []
    assert notes.answers(last_sent=9) == [(2, 6)]
    assert not notes.asked(5)
    notes.heard({}, {3: 5})
    assert notes.asked(5) and not notes.asked(6)
    assert notes.announce(5) and not notes.announce(5) and notes.announce(6)
