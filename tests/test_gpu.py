"""The GPU path on a CUDA GPU (issue 20): ``hopdec train --device cuda`` in the three modes, a user's loop with
its model on the GPU, a CUDA run checkpointed and resumed, the staged and CUDA-aware buffer choices, the
copies between host and device counted, and the stream order that keeps a Reduce or a send from reading a
buffer still being written. Marked ``gpu``; skipped, with the reason, where torch sees no CUDA device (the
suite's other MPI jobs run with the GPUs hidden: ``conftest.mpi_env``)."""

import json
import os
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, mpi_env, run_bounded

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")]

TRAIN = ["train", "--no-progress", "--threads", "1", "--device", "cuda"]
GPU = mpi_env(gpu=True)


def records(log_dir, rank):
    with open(os.path.join(log_dir, f"rank{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


def event(log_dir, rank, name):
    found = [r for r in records(log_dir, rank) if r.get("event") == name]
    assert len(found) == 1, (name, found)
    return found[0]


def header(log_dir, rank):
    return records(log_dir, rank)[0]["run"]


def mpi_says_cuda_aware(mpirun):
    """What the MPI the ranks load says (``cuda_aware_mpi`` run under mpirun: the library mpi4py loaded)."""
    out = mpirun.python(1, ["-c", "from mpi4py import MPI; from hopdec.transport.mpi import cuda_aware_mpi; "
                                  "print('@@', cuda_aware_mpi())"], env=GPU, timeout=60)
    assert out.returncode == 0, out.stderr
    return {"True": True, "False": False, "None": None}[out.stdout.split("@@")[1].split()[0]]


# ---------------------------------------------------------------- hopdec train on the GPU
@pytest.mark.parametrize("mode,ranks", [("decentralized", 2), ("ps", 3), ("allreduce", 2)])
def test_each_mode_trains_on_cuda_and_counts_its_host_device_copies(mpirun, tmp_path, mode, ranks):
    iters = 30
    out = mpirun(ranks, TRAIN + ["--mode", mode, "--iterations", iters, "--log-dir", tmp_path], env=GPU,
                 timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    worker = 1 if mode == "ps" else 0
    h = header(tmp_path, worker)
    assert h["device"] == "cuda:0"
    pcie = [ln for ln in out.stdout.splitlines() if ln.startswith("PCIe: ")]
    assert len(pcie) == 1 and "to the device" in pcie[0] and "per iteration" in pcie[0], out.stdout
    copies = event(tmp_path, worker, "device_copies")
    assert copies["device"] == "cuda:0"
    nbytes = h["params"] * 4
    up, down = copies["to_host"], copies["to_device"]
    assert up["loss"] == 4 * iters and down["data"] > 0      # every mini-batch and loss crossed, once
    if mode == "decentralized":                              # staged: one copy up per send, one down per
        assert h["mpi_buffers"] == "host"                    # update reduced (the default graph: 1 in-neighbour)
        assert up["parameters"] == nbytes * iters
        assert down["parameters"] == nbytes * iters
    else:                                                    # the gradient goes up, the new weights (or the
        assert up["gradient"] == nbytes * iters             # reduced gradient) come down
        if mode == "ps":                                     # (the first weights before the first step)
            assert down["parameters"] in (nbytes * iters, nbytes * (iters + 1))
        else:
            assert down["gradient"] == nbytes * iters
    acc = float(out.stdout.split("test accuracy")[1].split()[0])
    assert acc > 0.3                                         # 10 classes; 30 iterations of the digits CNN


def test_cuda_aware_auto_follows_the_mpi_and_yes_is_refused_where_it_would_crash(mpirun, tmp_path):
    aware = mpi_says_cuda_aware(mpirun)
    out = mpirun(2, TRAIN + ["--iterations", 5, "--log-dir", tmp_path / "auto"], env=GPU, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert header(tmp_path / "auto", 0)["mpi_buffers"] == ("device" if aware else "host")
    out = mpirun(2, TRAIN + ["--iterations", 5, "--cuda-aware-mpi", "yes", "--log-dir", tmp_path / "yes"],
                 env=GPU, timeout=180)
    if aware is False:                       # before: a segmentation fault in the first send
        lines = [ln for ln in out.stderr.splitlines() if "--cuda-aware-mpi yes" in ln]
        assert out.returncode != 0 and len(lines) == 1, out.stderr[-3000:]
        assert "cannot take CUDA device buffers" in lines[0] and "Segmentation" not in out.stderr
    else:
        assert out.returncode == 0, out.stderr[-3000:]
        assert header(tmp_path / "yes", 0)["mpi_buffers"] == "device"


def test_a_cuda_run_checkpointed_and_resumed_ends_as_the_uninterrupted_one(mpirun, tmp_path):
    args = TRAIN + ["--model", "mlp", "--topology", "complete", "--save-models", "--seed", "4"]
    out = mpirun(2, args + ["--iterations", 16, "--log-dir", tmp_path / "whole"], env=GPU, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    ck = tmp_path / "ck"
    out = mpirun(2, args + ["--iterations", 16, "--log-dir", tmp_path / "part", "--checkpoint-dir", ck,
                            "--checkpoint-every", 4, "--die-rank", 1, "--die-at", 10], env=GPU, timeout=180)
    assert out.returncode != 0
    out = mpirun(2, args + ["--iterations", 16, "--log-dir", tmp_path / "part", "--resume", ck], env=GPU,
                 timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [x["run"].get("resumed_from") for x in records(tmp_path / "part", 0) if "run" in x] == [None, 8]
    for r in range(2):
        np.testing.assert_allclose(np.load(tmp_path / "part" / f"params_rank{r}.npy"),
                                   np.load(tmp_path / "whole" / f"params_rank{r}.npy"), rtol=0, atol=1e-5)


USER_LOOP = r'''
import json, sys
import torch
from mpi4py import MPI
from hopdec.optim import HopOptimizer
rank = MPI.COMM_WORLD.Get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 4)).cuda()
opt = HopOptimizer(model.parameters(), torch.optim.AdamW, model=model, lr=1e-2, average_buffers=True,
                   log_dir=sys.argv[1])
g = torch.Generator().manual_seed(rank)
w = torch.randn(20, 4, generator=torch.Generator().manual_seed(99))
losses = []
for k in range(60):
    x = torch.randn(64, 20, generator=g)
    y = (x @ w).argmax(1)
    x, y = x.cuda(), y.cuda()
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step(loss=loss)
    losses.append(float(loss))
avg = opt.consensus_state_dict()
opt.finish()
if rank == 0:
    print("@@", json.dumps(dict(first=sum(losses[:10]) / 10, last=sum(losses[-10:]) / 10,
                               device=str(next(model.parameters()).device),
                               avg_device=str(next(iter(avg.values())).device))))
'''


def test_a_users_loop_with_its_model_on_cuda(mpirun, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(USER_LOOP)
    out = mpirun.python(2, [script, tmp_path / "logs"], env=GPU, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.split("@@")[1].splitlines()[0])
    assert got["device"] == "cuda:0" and got["avg_device"] == "cuda:0"
    assert got["last"] < 0.5 * got["first"]
    copies = event(tmp_path / "logs", 0, "device_copies")
    numel = header(tmp_path / "logs", 0)["params"]
    assert copies["to_host"]["parameters"] >= 60 * numel * 4      # each send staged through host memory


# ---------------------------------------------------------------- stream order (in-process, no MPI)
def _slow(device):
    """Queue ~50 ms of GPU work on the current stream: copies issued after it run after it."""
    torch.cuda._sleep(100_000_000)             # clock cycles: 50-100 ms at 1-2 GHz


def test_a_reduce_of_staged_updates_is_done_before_their_host_buffers_are_reused():
    """The received updates are pinned host buffers MPI reuses for the next messages as soon as Reduce
    returns: the asynchronous copies to the device must be done by then."""
    from hopdec.ml import transfers
    from hopdec.ml.trainer import FlatModel
    dev = torch.device("cuda:0")
    n = 1 << 20
    m = FlatModel([torch.nn.Parameter(torch.ones(n, device=dev))])
    bufs = [torch.full((n,), float(i + 2)).pin_memory().numpy() for i in range(2)]
    before = transfers.counts()
    _slow(dev)                                  # the copies queue behind this
    m.reduce([(None, 0.5), (bufs[0], 0.25), (bufs[1], 0.25)])
    for b in bufs:
        b[:] = -1000.0                          # MPI receives the next updates into them
    assert torch.allclose(m.values(), torch.full((n,), 0.5 + 0.25 * 2 + 0.25 * 3, device=dev))
    assert transfers.since(before)["to_device"]["parameters"] == 2 * n * 4


def test_a_staged_send_copies_the_parameters_after_the_step_that_wrote_them():
    from hopdec.ml.trainer import FlatModel
    dev = torch.device("cuda:0")
    n = 1 << 20
    m = FlatModel([torch.nn.Parameter(torch.zeros(n, device=dev))])
    out = torch.empty(n).pin_memory().numpy()
    _slow(dev)
    with torch.no_grad():
        m.values().add_(3.0)                    # the optimizer's step, still queued
    m.write_params(out)
    assert (out == 3.0).all()


SEND_FROM = r'''
import sys
import mpi4py
mpi4py.rc.initialize = False                    # a fake communicator: nothing reaches MPI
import torch
from hopdec import topology as T
from hopdec.hop.worker import node_views
from hopdec.transport.mpi import MPITransport

class Req:
    def Test(self): return True

class FakeComm:
    """A CUDA-aware MPI that reads a device buffer on a stream of its own when the send is posted."""
    def __init__(self): self.sent = []
    def Get_size(self): return 2
    def Irecv(self, buf, source, tag): return Req()
    def Isend(self, buf, dest, tag):
        if isinstance(buf, torch.Tensor) and buf.is_cuda:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                snap = buf.clone()
            s.synchronize()
            self.sent.append(float(snap[0]))
        return Req()

dev = torch.device("cuda:0")
comm = FakeComm()
io = MPITransport(comm, node_views(T.ring(2))[0], 1 << 20, 2, device_buffers=dev)
buf = torch.zeros(io.message_floats(), device=dev)
torch.cuda.synchronize()
torch.cuda._sleep(100_000_000)
buf[: 1 << 20].add_(7.0)                        # the step or Reduce that wrote the store, still queued
io.send_from(0, [1], buf)
print("@@", comm.sent)
'''


def test_a_send_from_device_memory_waits_for_the_kernels_that_wrote_it(tmp_path):
    """A CUDA-aware MPI reads the store on its own stream: ``send_from`` must hand it over only once the
    optimizer step and the Reduce that wrote it are done (before: it read the old values)."""
    script = tmp_path / "send_from.py"
    script.write_text(SEND_FROM)
    out = run_bounded([sys.executable, script], 120, env=mpi_env(gpu=True), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("@@")[1].strip() == "[7.0]"
