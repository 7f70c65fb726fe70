"""Checkpoint files and resume decisions, in-process: the data stream and trainer round trips, atomic
files, manifests, which checkpoint a resume takes, settings checks, and that loading never unpickles."""

import json
import os
import pickle

import numpy as np
import pytest
import torch

from hopdec.errors import ConfigError, RunError
from hopdec.ml.data import BatchStream, Dataset, load_dataset, partition
from hopdec.ml.trainer import LocalTrainer
from hopdec.runtime import checkpoint as C


def test_a_restored_batch_stream_yields_exactly_what_the_original_would():
    x = torch.arange(30).float().unsqueeze(1)
    y = torch.arange(30)
    idx = torch.arange(3, 26)
    for cut in (0, 1, 5, 6, 7, 13):                     # before the first batch, mid-epoch, at epoch ends
        a = BatchStream(x, y, idx, 4, seed=9)
        for _ in range(cut):
            next(a)
        saved = a.state()
        assert all(isinstance(v, np.ndarray) and v.dtype != object for v in saved.values())
        want = [next(a)[1].tolist() for _ in range(20)]
        b = BatchStream(x, y, idx, 4, seed=1234)        # another seed: the state decides everything
        b.load_state(saved)
        assert [next(b)[1].tolist() for _ in range(20)] == want
        assert b.batches == a.batches
    other = BatchStream(x, y, torch.arange(0, 23), 4, seed=9)
    next(a)
    with pytest.raises(ConfigError, match="another shard"):
        other.load_state(a.state())


def _trainer(**kw):
    ds = load_dataset("digits", seed=0)
    return LocalTrainer("cnn", ds, partition(ds.train_y, 3, 1, "iid", 0), lr=0.05, momentum=0.9,
                        weight_decay=1e-4, batch_size=16, seed=0, data_seed=5, **kw)


def test_a_restored_trainer_continues_bit_for_bit():
    a = _trainer()
    for _ in range(3):
        a.compute()
        a.apply()
    state = a.state()
    assert {"params", "momentum", "stream/generator", "stream/perm", "stream/pos", "rng/torch"} <= set(state)
    for _ in range(4):
        a.compute()
        a.apply()
    b = _trainer()
    b.load_state(state)
    for _ in range(4):
        b.compute()
        b.apply()
    assert np.array_equal(a.write_params(), b.write_params())
    c = LocalTrainer("mlp", load_dataset("digits", seed=0), torch.arange(100), lr=0.1)
    with pytest.raises(ConfigError, match="params"):
        c.load_state(state)


def test_running_batchnorm_statistics_travel_with_the_checkpoint():
    g = torch.Generator().manual_seed(0)
    ds = Dataset(torch.rand(16, 3, 32, 32, generator=g), torch.arange(16) % 10, torch.rand(4, 3, 32, 32),
                 torch.arange(4), num_classes=10, input_shape=(3, 32, 32), name="tiny")
    t = LocalTrainer("vgg11", ds, torch.arange(16), lr=0.01, batch_size=4, norm="running")
    t.compute()
    state = t.state()
    assert any(k.startswith("buffer/") and k.endswith("running_mean") for k in state)
    assert state["buffer/features.1.num_batches_tracked"].shape == ()      # a 0-d buffer, kept 0-d
    u = LocalTrainer("vgg11", ds, torch.arange(16), lr=0.01, batch_size=4, norm="running")
    u.load_state(state)
    for (_, a), (_, b) in zip(t.model.named_buffers(), u.model.named_buffers()):
        assert torch.equal(a, b)


def test_a_0d_buffer_survives_the_checkpoint_file(tmp_path):
    """``num_batches_tracked`` is 0-d; the file made it (1,) (``np.ascontiguousarray`` returns at least 1-d),
    so ``--resume`` of any model with running BatchNorm statistics (vgg11 --norm running, a model of your
    own) was refused: "the checkpoint's buffer/...num_batches_tracked has shape (1,), this model needs ()"."""
    g = torch.Generator().manual_seed(0)
    ds = Dataset(torch.rand(16, 3, 32, 32, generator=g), torch.arange(16) % 10, torch.rand(4, 3, 32, 32),
                 torch.arange(4), num_classes=10, input_shape=(3, 32, 32), name="tiny")
    t = LocalTrainer("vgg11", ds, torch.arange(16), lr=0.01, batch_size=4, norm="running")
    t.compute()
    C.write_arrays(tmp_path / "c.npz", t.state(), {"format": C.FORMAT})
    state, _ = C.read_arrays(tmp_path / "c.npz")
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in t.state().items()}
    u = LocalTrainer("vgg11", ds, torch.arange(16), lr=0.01, batch_size=4, norm="running")
    u.load_state(state)
    for (_, a), (_, b) in zip(t.model.named_buffers(), u.model.named_buffers()):
        assert torch.equal(a, b)


# ---- files ---------------------------------------------------------------------------------------------
def test_arrays_round_trip_and_writes_are_atomic(tmp_path, monkeypatch):
    path = tmp_path / "c.npz"
    C.write_arrays(path, {"a": np.arange(5, dtype=np.float32)}, {"format": C.FORMAT, "rank": 0})
    arrays, meta = C.read_arrays(path)
    assert np.array_equal(arrays["a"], np.arange(5)) and meta["rank"] == 0

    def boom(f, **kw):
        f.write(b"partial")
        raise OSError("disk full")
    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(RunError, match=f"cannot write {path}: disk full"):     # one line naming the file
        C.write_arrays(path, {"a": np.zeros(3)}, {"format": C.FORMAT})
    assert np.array_equal(C.read_arrays(path)[0]["a"], np.arange(5))   # the old file is intact
    assert os.listdir(tmp_path) == ["c.npz"]                              # and no temporary is left


def test_a_crafted_checkpoint_is_refused_and_never_run(tmp_path):
    """A checkpoint whose array is a pickle calling os.system: np.load(allow_pickle=False) refuses it."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    evil = np.empty(1, dtype=object)
    evil[0] = Evil()
    path = tmp_path / "rank0" / C.ckpt_name(5)
    path.parent.mkdir()
    meta = np.frombuffer(json.dumps({"format": C.FORMAT, "rank": 0}).encode(), dtype=np.uint8)
    np.savez(path, params=evil, meta=meta)                 # numpy pickles the object array
    with pytest.raises(ConfigError) as err:
        C.read_arrays(path)
    assert "refused" in str(err.value) and "\n" not in str(err.value)
    raw = tmp_path / "raw.npz"                              # a bare pickle under a checkpoint's name
    raw.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ConfigError, match="refused"):
        C.read_arrays(raw)
    man = tmp_path / "rank0" / C.MANIFEST
    man.write_text(json.dumps({"format": C.FORMAT, "complete": {"5": {"file": C.ckpt_name(5)}}}))
    with pytest.raises(ConfigError, match="refused"):
        C.load(str(tmp_path), 0, C.read_manifest(str(tmp_path), 0), 5)
    assert not marker.exists()


def test_a_manifest_lists_complete_checkpoints_and_old_ones_are_deleted(tmp_path):
    d = str(tmp_path)
    ck = C.RankCheckpoints(d, 1, 4, "decentralized", {"lr": 0.1}, 5, 40)
    for k in (5, 10, 15):
        ck.save(k, {"params": np.full(3, k, dtype=np.float32)}, {"log_offset": k * 10})
    man = C.read_manifest(d, 1)
    assert sorted(man["complete"]) == ["10", "15", "5"] and man["world"] == 4
    ck.forget_before(10)
    assert sorted(os.listdir(tmp_path / "rank1")) == [C.ckpt_name(10), C.ckpt_name(15), C.MANIFEST]
    arrays, meta = C.load(d, 1, C.read_manifest(d, 1), 15)
    assert arrays["params"][0] == 15 and meta["key"] == 15
    ck.save(20, {"params": np.zeros(3)}, also=(16, 17))            # one file for three cuts
    assert C.read_manifest(d, 1)["complete"]["16"]["file"] == C.ckpt_name(20)
    with pytest.raises(ConfigError, match="another run"):
        C.check_fresh(d, 1)
    C.check_fresh(d, 2)                                              # an empty rank directory is fine


def test_a_run_resumed_from_an_earlier_cut_drops_the_later_ones(tmp_path):
    """Resumed from cut 5 of {5, 10, 15}, a rank's later cuts are of the old future: were they kept, a later
    --resume could take 15 on this rank while another has rewritten it (two different runs' states)."""
    d = str(tmp_path)
    ck = C.RankCheckpoints(d, 1, 4, "ps", {"lr": 0.1}, 5, 40)
    for k in (5, 10, 15):
        ck.save(k, {"params": np.full(3, k, dtype=np.float32)})
    again = C.RankCheckpoints(d, 1, 4, "ps", {"lr": 0.1}, 5, 40, previous=C.read_manifest(d, 1), resumed=5)
    assert again.keys == [5]
    again.save(6, {"params": np.zeros(3)})
    assert sorted(C.read_manifest(d, 1)["complete"], key=int) == ["5", "6"]
    again.forget_before(6, keep=5)                                   # a pinned cut stays
    assert again.keys == [5, 6]


def _summaries(tmp_path, keys_per_rank, world=None, settings=None):
    d = str(tmp_path)
    for r, keys in enumerate(keys_per_rank):
        ck = C.RankCheckpoints(d, r, world or len(keys_per_rank), "decentralized", settings or {"lr": 0.1}, 5, 40)
        for k in keys:
            ck.save(k, {"params": np.zeros(2)})
    return [C.summary(d, r) for r in range(len(keys_per_rank))]


def test_resume_takes_the_latest_checkpoint_every_rank_has(tmp_path):
    s = _summaries(tmp_path, [[5, 10, 15], [5, 10], [10, 15, 20]])
    key, info = C.choose(str(tmp_path), s, 3, {"lr": 0.1})
    assert key == 10 and info["iterations"] == 40


def test_resume_onto_a_different_number_of_ranks_is_one_line(tmp_path):
    s = _summaries(tmp_path, [[5], [5], [5], [5]])
    with pytest.raises(ConfigError) as err:
        C.choose(str(tmp_path), s[:3], 3, {"lr": 0.1})
    msg = str(err.value)
    assert "written by 4 ranks, this run has 3" in msg and "out of scope" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="written by 4 ranks, this run has 5"):
        C.choose(str(tmp_path), s + [{"missing": True}], 5, {"lr": 0.1})


def test_resume_with_other_settings_names_the_option(tmp_path):
    s = _summaries(tmp_path, [[5], [5]], settings={"lr": 0.1, "max_ig": 2})
    with pytest.raises(ConfigError) as err:
        C.choose(str(tmp_path), s, 2, {"lr": 0.1, "max_ig": 3})
    assert "--max-ig 2, this run has --max-ig 3" in str(err.value)
    with pytest.raises(ConfigError, match="no checkpoint there"):
        C.choose(str(tmp_path / "nothing"), [{"missing": True}] * 2, 2, {})
    t = _summaries(tmp_path / "b", [[5], [10]])
    with pytest.raises(ConfigError, match="no checkpoint is complete on every rank"):
        C.choose(str(tmp_path / "b"), t, 2, {"lr": 0.1})


def test_the_resume_command_repeats_the_run_with_resume(monkeypatch):
    monkeypatch.delenv("HOPDEC_RESUME_WITH", raising=False)
    argv = ["--topology", "ring", "--resume", "old", "--die-rank", "1", "--iterations=9", "--checkpoint-dir", "ck"]
    cmd = C.resume_command(argv, 4, "ck")
    assert cmd == "mpirun -n 4 hopdec train --topology ring --iterations=9 --checkpoint-dir ck --resume ck"
    # started by a launch script: the script again (a bare mpirun lacks its flags: as root it is refused)
    monkeypatch.setenv("HOPDEC_RESUME_WITH", "/opt/my\\ dir/launch/local.sh -n 4 ")
    assert C.resume_command(argv, 4, "ck") == ("'/opt/my dir/launch/local.sh' -n 4 --topology ring --iterations=9 "
                                               "--checkpoint-dir ck --resume ck")
    for bad in ("launch/local.sh 'unclosed", "a\nb", " "):       # not shell words: the plain command
        monkeypatch.setenv("HOPDEC_RESUME_WITH", bad)
        assert C.resume_command(argv, 4, "ck").startswith("mpirun -n 4 hopdec train ")


def test_trim_log_keeps_whole_lines_only(tmp_path):
    log = tmp_path / "rank0.jsonl"
    log.write_text('{"a": 1}\n{"b": 2}\n{"c": 3}\n')
    from hopdec.files import trim_log
    assert trim_log(log, 9) and log.read_text() == '{"a": 1}\n'
    assert not trim_log(log, 5) and log.read_text() == '{"a": 1}\n'   # not at a line end: left alone
    assert not trim_log(tmp_path / "none.jsonl", 0)


# ---- stop requests -----------------------------------------------------------------------------------------
def test_a_stop_signal_sets_a_flag_instead_of_raising():
    import signal

    from hopdec.runtime import interrupt
    saved = {s: signal.getsignal(getattr(signal, s)) for s in interrupt.STOP_SIGNALS}
    try:
        interrupt.reset()
        interrupt.install()
        os.kill(os.getpid(), signal.SIGINT)                 # no KeyboardInterrupt: a clean stop, not a failure
        os.kill(os.getpid(), signal.SIGUSR1)
        assert interrupt.requested() == signal.SIGINT        # the first request is the one kept
        assert interrupt.signal_name(interrupt.requested()) == "SIGINT"
    finally:
        interrupt.reset()
        for s, h in saved.items():
            signal.signal(getattr(signal, s), h)


def test_every_wait_calls_the_watch_between_polls_but_never_inside_it():
    from hopdec.transport.waiting import poll_until, watching
    polls, seen = iter(range(6)), []

    def watch():
        seen.append("watch")
        poll_until(lambda: True, 1, "inner")                 # a wait inside the watch: no recursion
    with watching(watch):                                   # (napping: between every two polls; while a
        assert poll_until(lambda: next(polls) >= 3, 5, "outer", spin=0)     # wait spins, every 250 us)
    assert seen == ["watch"] * 3
    poll_until(lambda: next(polls) >= 5, 5, "after")        # outside the block: no watch
    assert seen == ["watch"] * 3
