"""``HopSGD``: decentralized SGD as an optimizer you drop into an existing PyTorch training loop.

It runs the same protocol core and worker loop as ``hopdec train`` (parallel computation graph, Hop
Figure 7), paused at each Compute so that your loop computes the gradient::

    from hopdec.optim import HopSGD
    opt = HopSGD(model, lr=0.05, momentum=0.9, topology="topologies/ring_based_8.json", steps=1000)
    for step in range(1000):                  # every rank takes the same number of steps
        xb, yb = next(batches)
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()          # Recv + Reduce with neighbours, apply the gradient, take tokens, Send next
    opt.close()             # drain messages; every rank calls it

Run it under ``mpirun`` (one rank per node of the topology). Model parameters become views of one flat
buffer (see :func:`hopdec.ml.trainer.flatten_parameters`); keep using ``model`` as before.
"""

import torch

from hopdec.core import Wait
from hopdec.errors import ConfigError
from hopdec.hop.config import ProtocolConfig, check_config
from hopdec.hop.worker import Worker, node_views
from hopdec.ml.trainer import FlatSGD, regather_grads
from hopdec.runtime.hop_loop import worker_loop


class HopSGD:
    """SGD (momentum, weight decay) whose step averages parameters with graph neighbours (Hop)."""

    def __init__(self, model, lr, momentum=0.0, weight_decay=0.0, topology=None, comm=None, steps=None,
                 protocol="tokens", max_ig=2, backup_workers=0, staleness=None, stale_reduce="weighted",
                 peer_timeout=120.0, on_record=None):
        from mpi4py import MPI

        from hopdec import topology as T
        from hopdec.transport.mpi import MPITransport

        self.comm = comm or MPI.COMM_WORLD
        size = self.comm.Get_size()
        if topology is None:
            graph = T.default_topology(size)
        else:
            graph = (T.load(topology) if isinstance(topology, str) else
                     T.effective_graph(topology, topology.graph.get("source", "topology")))
        if graph.number_of_nodes() != size:
            raise ConfigError(f"{graph.graph.get('source', 'topology')}: has {graph.number_of_nodes()} "
                              f"workers but the communicator has {size} ranks")
        cfg = ProtocolConfig(iterations=steps or 2 ** 62, protocol=protocol, max_ig=max_ig,
                             backup_workers=backup_workers, staleness=staleness, stale_reduce=stale_reduce)
        views = node_views(graph)
        check_config(cfg, views)
        self.model = model
        self.params = FlatSGD(model, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.flat = self.params.flat
        self.optimizer = self.params.optimizer
        self.core = Worker(views[self.comm.Get_rank()], cfg)
        self.io = MPITransport(self.comm, self.core.view, self.params.numel, self.core.slots,
                               peer_timeout=peer_timeout, host_pinned=self.params.device.type == "cuda")
        self.params.use_send_storage(self.io.message_floats())    # CPU: sends without a copy
        self.send_storage = self.params.send_storage
        self.spare_storage = self.params.spare_storage
        self._loop = worker_loop(self.core, self.io, self, on_record=on_record, step=True)
        self.finished = False
        self._advance()                               # Enter(0), Send(0): stop where the gradient is due

    # ---- what users call ----
    def zero_grad(self):
        self.flat.grad.zero_()

    def step(self):
        """Reduce(k) with the neighbours' iteration-k parameters, apply the gradient, enter k + 1."""
        if self.finished:
            raise RuntimeError("HopSGD: all steps are done")
        regather_grads(self.model, self.flat)
        self._advance()

    @property
    def iteration(self):
        return self.core.iteration

    def close(self):
        """Finish the protocol and drain the network (collective: every rank calls it)."""
        self.io.close()

    # ---- the backend interface of hopdec.runtime.hop_loop ----
    def write_params(self, out=None):
        return self.params.write_params(out)

    def compute(self, iteration):
        self._at_compute = True                        # the user's loop computes; we pause here
        return {"loss": None, "compute_s": 0.0}

    def reduce(self, pairs):
        self.params.reduce(pairs)

    def apply(self, iteration):
        self.params.apply()

    def _advance(self):
        self._at_compute = False
        while not self._at_compute:
            try:
                got = next(self._loop)
            except StopIteration:
                self.finished = True
                return
            if isinstance(got, Wait):
                self.io.wait(self.core, got)
