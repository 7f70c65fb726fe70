"""The GPU data path's decisions that need no GPU (issue 20): which buffers MPI gets (``--cuda-aware-mpi``),
that a send from device memory waits for the device, and the summary's line on host-device copies. The
same paths run on a GPU in ``tests/test_gpu.py``."""

import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, mpi_env, run_bounded
from hopdec.errors import ConfigError
from hopdec.ml import transfers
from hopdec.runtime import hop_mpi


@pytest.mark.parametrize("says", [False, None, True])
def test_cuda_aware_yes_is_refused_only_where_the_mpi_says_it_cannot(monkeypatch, says):
    import hopdec.transport.mpi as tm
    monkeypatch.setattr(tm, "cuda_aware_mpi", lambda: says)
    gpu = torch.device("cuda:0")
    if says is False:                           # it would crash in the first send (seen: SIGSEGV in ob1)
        with pytest.raises(ConfigError, match="--cuda-aware-mpi yes: this MPI says it cannot take CUDA"):
            hop_mpi.mpi_buffers_on("yes", gpu)
    else:                                       # it says it can, or does not say: the user knows
        assert hop_mpi.mpi_buffers_on("yes", gpu) == gpu
    assert hop_mpi.mpi_buffers_on("auto", gpu) == (gpu if says else None)
    assert hop_mpi.mpi_buffers_on("no", gpu) is None
    cpu = torch.device("cpu")                   # on CPU, yes is the tensor path whatever the MPI says
    assert hop_mpi.mpi_buffers_on("yes", cpu) == cpu and hop_mpi.mpi_buffers_on("auto", cpu) is None


SEND_FROM = r'''
import mpi4py
mpi4py.rc.initialize = False                    # a fake communicator: nothing reaches MPI
import torch
from hopdec import topology as T
from hopdec.hop.worker import node_views
from hopdec.transport.mpi import MPITransport

calls = []

class Req:
    def Test(self): return True

class FakeComm:
    def Get_size(self): return 2
    def Irecv(self, buf, source, tag): return Req()
    def Isend(self, buf, dest, tag):
        calls.append("Isend")
        return Req()

io = MPITransport(FakeComm(), node_views(T.ring(2))[0], 10, 2, device_buffers=torch.device("cpu"))
io._sync = lambda: calls.append("sync")         # on a GPU: wait for the kernels that wrote the store
buf = torch.zeros(io.message_floats())
io.send_from(0, [1], buf)
print("@@", calls)
'''


def test_a_send_from_device_buffers_synchronizes_before_mpi_reads_them(tmp_path):
    """With device buffers (CUDA-aware MPI) the store a send reads was written by kernels that may still be
    queued (the optimizer's step, a Reduce): the transport waits for the device before posting the Isend.
    Before, only the copying path did; the zero-copy path handed MPI the store at once."""
    script = tmp_path / "send_from.py"
    script.write_text(SEND_FROM)
    out = run_bounded([sys.executable, script], 120, env=mpi_env(), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("@@")[1].strip() == "['sync', 'Isend']"


def _copies(down=0, up=0, data=0):
    c = {"to_device": dict.fromkeys(transfers.KINDS, 0), "to_host": dict.fromkeys(transfers.KINDS, 0)}
    c["to_device"]["parameters"], c["to_host"]["parameters"], c["to_device"]["data"] = down, up, data
    return c


def test_the_summary_line_on_host_device_copies():
    assert transfers.per_iteration_line([(0, "cpu", _copies(), 10)], "host") is None
    line = transfers.per_iteration_line([(0, "cuda:0", _copies(down=2_400_000, up=1_200_000, data=25_600), 10),
                                         (1, "cuda:1", _copies(down=1_200_000, up=1_200_000), 10)], "host")
    # MiB (2^20 bytes), as every size hopdec prints: 242,560 bytes an iteration are 0.231 MiB (it said
    # "0.243 MB" in 10^6 bytes, 4.9% from the simulator's and the report's MiB)
    assert line.startswith("PCIe: rank 0 (cuda:0) copied 0.231 MiB to the device and 0.114 MiB to the host per "
                           "iteration (parameters 0.343 MiB, data 2,560 bytes; MPI buffers staged through "
                           "pinned host memory); every GPU rank: 0.114-0.231 MiB to the device, 0.114 MiB to the "
                           "host"), line
    assert "CUDA-aware" in transfers.per_iteration_line([(0, "cuda:0", _copies(data=10), 1)], "device")


def test_a_cpu_model_counts_no_copies():
    from hopdec.ml.trainer import FlatModel
    before = transfers.counts()
    m = FlatModel([torch.nn.Parameter(torch.ones(100))])
    m.reduce([(None, 0.5), (np.full(100, 3.0, dtype=np.float32), 0.5)])
    m.write_params(np.empty(100, dtype=np.float32))
    assert transfers.since(before) == {d: dict.fromkeys(transfers.KINDS, 0) for d in ("to_device", "to_host")}
    assert float(m.values()[0]) == 2.0
