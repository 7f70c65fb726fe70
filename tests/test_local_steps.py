"""Local steps with an outer optimizer (``--local-steps H``, ``--outer-optimizer``; issue 18 item 1): the
outer step is torch's SGD/Nesterov on the pseudo-gradient, a round on both computation graphs computes
DiLoCo's update around Hop's exchange, H = 1 with the plain outer step is Hop's run bit for bit, the options'
defaults and refusals, and the simulator, the invariants and ``topo analyze`` counting rounds. The real
``mpirun`` runs are in test_local_steps_mpi.py."""

import io
import json

import numpy as np
import pytest
import torch

from hopdec.cli.sim import main as sim_main, parse
from hopdec.errors import ConfigError
from hopdec.hop.config import ProtocolConfig, describe, outer_step, round_steps, rounds
from hopdec.ml.trainer import FlatModel, LocalRounds, OuterStep
from hopdec.runtime.metrics import read_log
from hopdec.sim.run import simulate


# ---- the outer step ----
@pytest.mark.parametrize("kind,lr,momentum", [("nesterov", 0.7, 0.9), ("sgd", 0.5, 0.8), ("sgd", 1.0, 0.0)])
def test_the_outer_step_is_torch_sgd_on_the_pseudo_gradient(kind, lr, momentum):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, generator=g)
    ref = torch.nn.Parameter(x.clone())
    opt = torch.optim.SGD([ref], lr=lr, momentum=momentum, nesterov=kind == "nesterov")
    outer = OuterStep(kind, lr, momentum)
    for _ in range(4):
        delta = torch.randn(7, generator=g)
        ref.grad = delta.clone()
        opt.step()
        outer.step(x, delta.clone())
        torch.testing.assert_close(x, ref.detach(), rtol=0, atol=1e-6)


def test_outer_defaults_are_diloco_with_local_steps_and_the_plain_step_without():
    assert outer_step(8) == ("nesterov", 0.7, 0.9)
    assert outer_step(1) == ("sgd", 1.0, 0.0)
    assert outer_step(8, "sgd") == ("sgd", 1.0, 0.0)
    assert outer_step(1, "nesterov", 0.5) == ("nesterov", 0.5, 0.9)
    assert not ProtocolConfig(iterations=4).rounds
    assert ProtocolConfig(iterations=4, local_steps=1, outer_optimizer="nesterov", outer_lr=0.7,
                          outer_momentum=0.9).rounds
    assert rounds(30, 4) == 8 and list(round_steps(7, 4, 30)) == [28, 29]
    cfg = ProtocolConfig(iterations=4, local_steps=8, outer_optimizer="nesterov", outer_lr=0.7, outer_momentum=0.9)
    assert "+local(H=8, outer nesterov lr 0.7 momentum 0.9)" in describe(cfg)


@pytest.mark.parametrize("args,option", [((8, "adam"), "--outer-optimizer"), ((8, "sgd", 0.0), "--outer-lr"),
                                         ((8, "sgd", float("nan")), "--outer-lr"),
                                         ((8, "sgd", 1.0, 1.0), "--outer-momentum"),
                                         ((8, "nesterov", 0.7, 0.0), "--outer-momentum")])
def test_bad_outer_steps_name_the_option(args, option):
    with pytest.raises(ConfigError, match=option):
        outer_step(*args)


# ---- a round on a flat model, against the formula ----
TARGET = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0])


def flat_model():
    p = torch.nn.Parameter(torch.tensor([0.3, 0.1, -0.4, 0.9, 2.0]))
    m = FlatModel([p])
    return m, p, torch.optim.SGD([m.flat], lr=0.1, momentum=0.5)


def grad_here(m, p):
    """The quadratic's gradient at the parameter the model's views show (what the inner steps train)."""
    m.flat.grad = (p.detach() - TARGET).reshape(-1).clone()


def inner_steps(w, opt_state, steps, lr=0.1, momentum=0.5):
    """``steps`` SGD-momentum steps on the quadratic from ``w`` (the formula the round must follow)."""
    for _ in range(steps):
        d = w - TARGET
        opt_state["buf"] = d.clone() if opt_state.get("buf") is None else opt_state["buf"] * momentum + d
        w = w - lr * opt_state["buf"]
    return w


@pytest.mark.parametrize("graph", ["parallel", "serial"])
@pytest.mark.parametrize("kind,lr,momentum", [("nesterov", 0.7, 0.9), ("sgd", 1.0, 0.0)])
def test_a_round_is_the_outer_step_around_the_exchange(graph, kind, lr, momentum):
    """Parallel: x <- x_bar - outer(a - w_H) with the anchor a sent while a copy trains (the plain step:
    x_bar + (w_H - a)); serial: z <- a - outer(a - w_H), then the exchange averages z."""
    H, other = 3, torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5])
    m, p, opt = flat_model()
    r = LocalRounds(m, H, OuterStep(kind, lr, momentum), graph)
    ref_outer, ref_inner, x = OuterStep(kind, lr, momentum), {}, m.values().clone()
    for k in range(2):
        r.begin(k)
        sent_anchor = m.values().clone()
        for _ in range(H - 1):
            grad_here(m, p)
            opt.step()
            r.taken += 1
        grad_here(m, p)
        if graph == "parallel":
            assert torch.equal(m.values(), sent_anchor)        # what was sent meanwhile did not move
            m.reduce([(None, 0.5), (other.numpy(), 0.5)])
            r.end(k, opt.step)
            w = inner_steps(x.clone(), ref_inner, H)
            x_bar = 0.5 * x + 0.5 * other
            x = x_bar.clone()
            ref_outer.step(x, x_bar.new_tensor(0) + (sent_anchor - w))
        else:
            r.end(k, opt.step)
            w = inner_steps(x.clone(), ref_inner, H)
            z = sent_anchor.clone()
            ref_outer.step(z, sent_anchor - w)
            torch.testing.assert_close(m.values(), z, rtol=0, atol=1e-6)
            m.reduce([(None, 0.5), (other.numpy(), 0.5)])
            x = 0.5 * z + 0.5 * other
        torch.testing.assert_close(m.values(), x, rtol=0, atol=1e-6)
        # the parameters are views of the values again (what the next round sends is what the model is)
        assert p.data_ptr() == m.values().data_ptr()


# ---- the simulator: H = 1 is Hop; H > 1 counts rounds ----
def sim(argv):
    out = io.StringIO()
    res = simulate(parse([str(a) for a in argv]), out=out)
    return res, out.getvalue()


BASE = ["-n", 4, "--topology", "ring-based", "--math", "--model", "mlp", "--iterations", 16, "--no-progress"]


def test_one_local_step_with_the_plain_outer_step_is_hops_run(tmp_path):
    for name, extra in (("hop", []), ("h1", ["--local-steps", 1, "--outer-optimizer", "sgd"])):
        sim(BASE + ["--log-dir", tmp_path / name] + extra)
    for r in range(4):
        assert read_log(tmp_path / "hop" / f"rank{r}.jsonl") == read_log(tmp_path / "h1" / f"rank{r}.jsonl")
    ev = [json.loads(x) for x in open(tmp_path / "hop" / "eval.jsonl")]
    assert ev == [json.loads(x) for x in open(tmp_path / "h1" / "eval.jsonl")]


def test_local_steps_in_the_simulator_count_rounds_and_send_once_per_round(tmp_path):
    _, text1 = sim(BASE + ["--log-dir", tmp_path / "h1"])
    _, text = sim(BASE + ["--log-dir", tmp_path / "h4", "--local-steps", 4, "--backup-workers", 1])
    assert "+local(H=4, outer nesterov lr 0.7 momentum 0.9)" in text
    assert "rounds: 4 rounds of 4 local steps (16 inner steps per worker" in text
    assert "no update lost, in rounds) held at all" in text
    header = json.loads(open(tmp_path / "h4" / "rank0.jsonl").readline())["run"]
    recs = read_log(tmp_path / "h4" / "rank0.jsonl")
    assert header["local_steps"] == 4 and header["inner_steps"] == 16 and header["iterations"] == 4
    assert header["outer"] == dict(optimizer="nesterov", lr=0.7, momentum=0.9)
    its = recs
    assert [r["iter"] for r in its] == [0, 1, 2, 3] and {r["inner_steps"] for r in its} == {4}
    # a round's compute is its inner steps' (0.1 s each by default), its traffic one exchange
    assert its[0]["compute_s"] == pytest.approx(0.4)
    sent = lambda d: sum(r["sent_bytes"] for r in read_log(d / "rank0.jsonl"))  # noqa: E731
    assert sent(tmp_path / "h4") * 4 == pytest.approx(sent(tmp_path / "h1"), rel=0.01)


def test_one_round_is_said_in_the_singular():
    _, text = sim(["-n", 4, "--topology", "ring-based", "--iterations", 3, "--local-steps", 4, "--max-ig", 1,
                   "--no-progress"])
    assert "rounds: 1 round of 4 local steps (3 inner steps per worker; the iterations above are rounds); " \
           "gap bound 1 round = 4 inner steps" in text
    # the table's columns count rounds too (their mean compute is a round's: 3 inner steps of 0.1 s)
    head, row = text.splitlines()[1].split(), text.splitlines()[3].split()
    assert head[:4] == ["rank", "rounds", "run", "rounds/s"] and row[1] == "1" and float(row[4]) == pytest.approx(0.3)
    _, plain = sim(["-n", 4, "--iterations", 3, "--no-progress"])
    assert plain.splitlines()[1].split()[:4] == ["rank", "iters", "run", "iter/s"]


def test_a_run_resumed_after_a_short_round_takes_each_inner_step_once():
    """A checkpoint at round 3 after 10 inner steps (rounds of 4, the last of 2), resumed to 24: rounds 3..6
    are 10-13, 14-17, 18-21, 22-23 (they were 12-15, 16-19, 20-23: steps 10 and 11 never trained, 22
    mini-batches said 24); a checkpoint of whole rounds keeps the plain rounds."""
    from hopdec.cli.sim import parse as sim_parse
    from hopdec.modes.decentralized import HopRun, resolve_topology
    from hopdec.modes.work import resolve
    settings = sim_parse(["--topology", "complete", "-n", "2", "--model", "mlp", "--local-steps", "4",
                          "--iterations", "24"])
    run = HopRun(settings, resolve_topology("complete", 2)).with_work(resolve(settings.work, 2))
    go_on = run.continued_from(3, 10)
    assert go_on.cfg.iterations == 7 == rounds(24, 4, (3, 10)) and run.cfg.iterations == 6
    assert [list(go_on.round_steps(k)) for k in range(3, 7)] == [[10, 11, 12, 13], [14, 15, 16, 17],
                                                                 [18, 19, 20, 21], [22, 23]]
    assert [go_on.inner_steps_at(k) for k in (3, 5, 7)] == [10, 18, 24]     # what its checkpoints record
    whole = run.continued_from(3, 12)
    assert whole.cfg.iterations == 6 and all(whole.round_steps(k) == run.round_steps(k) for k in range(3, 6))
    assert run.continued_from(3).cfg.iterations == 6     # (a checkpoint without its inner steps: whole rounds)


def test_the_parameter_server_refuses_local_steps_with_one_line(capsys):
    assert sim_main(["--mode", "ps", "-n", "3", "--local-steps", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--local-steps" in err[0] and "decentralized mode only" in err[0]


@pytest.mark.parametrize("argv,option", [(["--local-steps", "0"], "--local-steps"),
                                         (["--outer-lr", "-1"], "--outer-lr"),
                                         (["--outer-momentum", "1.5"], "--outer-momentum")])
def test_bad_local_step_options_are_one_line(argv, option, capsys):
    assert sim_main(["-n", "3"] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and option in err[0]


def test_topo_analyze_says_the_bounds_count_rounds(tmp_path, capsys):
    from hopdec.cli.topo import main as topo
    path = tmp_path / "ring.json"
    assert topo(["generate", "ring", "-n", "6", "-o", str(path)]) == 0
    capsys.readouterr()
    assert topo(["analyze", str(path), "--local-steps", "8"]) == 0
    assert "with --local-steps 8 an iteration is a round of 8 inner steps" in capsys.readouterr().out
    assert topo(["analyze", str(path), "--local-steps", "8", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["local_steps"] == 8
    assert s["gap_bounds_inner_steps"]["standard"] == 8 * s["gap_bounds"]["standard"]


def test_math_with_message_mb_charges_coded_messages_of_that_size(tmp_path):
    """--math --message-mb M --compress int8: each coded message weighs what M MiB of values coded would
    (the real model is coded, its size scaled), as in a timing-only run; it used to charge the real small
    model's coded size against an uncoded M MiB, a compression ratio of thousands."""
    argv = ["-n", 4, "--topology", "one-peer-exponential", "--model", "mlp", "--iterations", 8, "--compress",
            "int8", "--message-mb", 8, "--no-progress"]
    _, text = sim(argv + ["--math"])
    per_worker = lambda t: float(t.split("traffic: ")[1].split()[0].replace(",", ""))  # noqa: E731
    assert "coded to 2.031 MiB by --compress int8" in text
    assert per_worker(text) == pytest.approx(per_worker(sim(argv)[1]), rel=0.01)


def test_fault_tolerance_refuses_local_steps_with_one_line():
    from hopdec.hop.config import check_config
    from hopdec.hop.worker import node_views
    from hopdec import topology as T
    cfg = ProtocolConfig(iterations=4, local_steps=4, outer_optimizer="nesterov", outer_lr=0.7, outer_momentum=0.9,
                         fault_tolerant=True)
    with pytest.raises(ConfigError, match="--local-steps.*--fault-tolerance"):
        check_config(cfg, node_views(T.ring(4)))


def test_the_report_says_a_run_took_local_steps(tmp_path):
    from hopdec.report.data import Run
    header = dict(mode="decentralized", setting="standard", protocol="tokens", topology="ring(4)", compress="int8",
                  local_steps=8, outer=dict(optimizer="nesterov", lr=0.7, momentum=0.9))
    text = Run(header, {}, {}).describe()
    assert "--compress int8" in text and "rounds of 8 local steps (outer nesterov lr 0.7 momentum 0.9" in text
    assert "local" not in Run(dict(header, local_steps=None, compress="none"), {}, {}).describe()


@pytest.mark.parametrize("local,ft,words", [((0, None, None, None), False, "local_steps 0"),
                                            ((4, "adam", None, None), False, "outer_optimizer 'adam'"),
                                            ((4, None, None, 1.0), False, "outer_momentum 1"),
                                            ((4, None, None, None), True, "with fault_tolerance")])
def test_the_optimizer_names_its_own_keywords_in_refusals(local, ft, words):
    from hopdec import topology as T
    from hopdec.optim import assembly
    with pytest.raises(ConfigError, match=words):
        assembly.protocol_config("tokens", 2, "parallel", 0, None, "weighted", None, T.ring(4), ft, "none", local)


def test_topo_analyze_of_a_schedule_says_its_bounds_count_rounds_too(tmp_path, capsys):
    """``topo analyze one_peer_8.json --local-steps 8`` printed the schedule's Table 1 without a word on
    rounds (the static graph's text had it; the JSON had both): --local-steps was silently ignored."""
    from hopdec.cli.topo import main as topo
    path = tmp_path / "one_peer_8.json"
    assert topo(["generate", "one-peer-exponential", "-n", "8", "-o", str(path)]) == 0
    capsys.readouterr()
    assert topo(["analyze", str(path), "--local-steps", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(out) if x.startswith("Hop Table 1 on the time-varying graph"))
    assert out[at + 1].startswith("  with --local-steps 8 an iteration is a round of 8 inner steps: every bound "
                                  "below, the schedule's step and max_ig count rounds")
    assert out[at + 2] == "  a bound of B rounds is B*8 inner steps between two workers' round starts"
