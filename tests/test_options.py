"""``hopdec train``'s numeric options, ``--device`` and ``--max-ig`` sizes: one line naming the option."""

import subprocess
import sys

import pytest
import torch

from hopdec.cli.train import parse
from hopdec.runtime.buffers import check_buffers, receive_buffer_bytes
from hopdec.runtime.setup import setup
from hopdec.errors import ConfigError
from hopdec.hop.config import ProtocolConfig
from hopdec.hop.worker import node_views
from hopdec.runtime.context import pick_device
from hopdec import topology as T
from fake_comm import SizedComm

BAD_NUMBERS = [
    (["--lr", "nan"], "--lr"), (["--lr", "inf"], "--lr"), (["--lr", "0"], "--lr"),
    (["--momentum", "-1"], "--momentum"), (["--momentum", "nan"], "--momentum"),
    (["--momentum", "1.5"], "--momentum"),
    (["--weight-decay", "-1"], "--weight-decay"), (["--weight-decay", "inf"], "--weight-decay"),
    (["--epochs", "nan"], "--epochs"), (["--epochs", "inf"], "--epochs"), (["--epochs", "0"], "--epochs"),
    (["--iterations", "0"], "--iterations"), (["--batch-size", "0"], "--batch-size"),
    (["--peer-timeout", "nan"], "--peer-timeout"), (["--peer-timeout", "0"], "--peer-timeout"),
    (["--peer-timeout", "-5"], "--peer-timeout"), (["--peer-timeout", "inf"], "--peer-timeout"),
    (["--esync-epsilon", "nan"], "--esync-epsilon"), (["--esync-epsilon=-inf"], "--esync-epsilon"),
    (["--compute-time", "inf"], "--compute-time"), (["--compute-time", "nan"], "--compute-time"),
    (["--compute-time", "0"], "--compute-time"),
    (["--eval-interval", "inf"], "--eval-interval"), (["--eval-interval", "-1"], "--eval-interval"),
    (["--seed", "-1"], "--seed"), (["--seed", str(2 ** 64)], "--seed"), (["--seed", str(2 ** 32)], "--seed"),
    (["--threads", "-1"], "--threads"), (["--threads", "0"], "--threads"),
    (["--threads", "100000"], "--threads"),
    (["--max-ig", "0"], "--max-ig"), (["--backup-workers", "-1"], "--backup-workers"),
    (["--staleness", "-2"], "--staleness"), (["--lookahead", "0"], "--lookahead"),
    (["--iterations", "5", "--epochs", "1"], "--iterations and --epochs"),
]


@pytest.mark.parametrize("argv,option", BAD_NUMBERS, ids=[" ".join(a) for a, _ in BAD_NUMBERS])
def test_out_of_range_numbers_name_the_option(argv, option):
    with pytest.raises(ConfigError) as err:
        parse(argv)
    assert str(err.value).startswith(option) and "\n" not in str(err.value)


def test_in_range_numbers_pass():
    assert parse([]).protocol.max_ig == 2
    s = parse(["--lr", "0.1", "--momentum", "0", "--weight-decay", "0", "--epochs", "0.5", "--seed",
               str(2 ** 32 - 1), "--threads", "1", "--peer-timeout", "0.5",
               "--compute-time", "0.01", "--eval-interval", "0", "--staleness", "0", "--max-ig", "1"])
    assert (s.work.lr, s.protocol.max_ig, s.protocol.staleness) == (0.1, 1, 0)
    s = parse(["--sync", "esync", "--esync-epsilon", "-0.2", "--iterations", "1000000000", "--lr", "1000"])
    assert s.ps.esync_epsilon == -0.2 and s.work.lr == 1000


@pytest.mark.parametrize("argv", [["--lr", "nan"], ["--seed", "-1"], ["--peer-timeout", "nan"]])
def test_setup_checks_numbers_before_anything_else(argv):
    # a bad number wins over a topology that does not even exist: nothing is loaded before the check
    with pytest.raises(ConfigError, match="^" + argv[0]):
        setup(parse(argv + ["--topology", "/nonexistent/graph.json"]), SizedComm(4))


def test_device_garbage_and_missing_cuda():
    with pytest.raises(ConfigError, match="--device 'garbage': expected auto, cpu, cuda or cuda:N"):
        pick_device("garbage", 0)
    with pytest.raises(ConfigError, match="--device 'meta'"):
        pick_device("meta", 0)
    assert pick_device("cpu", 0) == torch.device("cpu")
    if not torch.cuda.is_available():
        for spec in ("cuda", "cuda:0"):
            with pytest.raises(ConfigError, match=f"--device {spec}: no CUDA device here"):
                pick_device(spec, 0)
        assert pick_device("auto", 3) == torch.device("cpu")
    else:
        n = torch.cuda.device_count()
        with pytest.raises(ConfigError, match=f"has {n} CUDA device"):
            pick_device(f"cuda:{n}", 0)


def test_max_ig_buffers_are_checked_against_memory():
    views = node_views(T.ring(4))
    cfg = ProtocolConfig(iterations=10, max_ig=1_000_000)
    assert receive_buffer_bytes(2, 2, 10) == (3 * 2 + 4) * 12 * 4     # (slots x in + send pool) x floats x 4
    with pytest.raises(ConfigError, match=r"^--max-ig 1000000: .* would need \d+ GiB of memory"):
        check_buffers(cfg, views, numel=151306)
    check_buffers(ProtocolConfig(iterations=10, max_ig=2), views, numel=151306, ranks_here=4)
    # without token queues --max-ig allocates nothing
    check_buffers(ProtocolConfig(iterations=10, protocol="queue-only", max_ig=1_000_000), views, 151306)


def test_setup_refuses_huge_max_ig_before_training():
    settings = parse(["--max-ig", "1000000", "--topology", "ring", "--threads", "1", "--no-progress"])
    with pytest.raises(ConfigError, match="^--max-ig 1000000: .*parameters"):
        setup(settings, SizedComm(4))


@pytest.mark.parametrize("argv,option", [(["--lr", "nan"], "--lr"), (["--device", "garbage"], "--device"),
                                         (["--seed", "-1"], "--seed")])
def test_train_command_one_line(argv, option):
    r = subprocess.run([sys.executable, "-m", "hopdec.cli", "train", *argv], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0], r.stderr
