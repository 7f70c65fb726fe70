"""The structure of PyTorch's public MNIST example (``pytorch/examples``, ``mnist/main.py``: a two-conv net
with dropout, ``Adadelta(lr=1.0)``, ``StepLR(step_size=1, gamma=0.7)``, ``train()``/``test()`` per epoch),
ported to ``hopdec.optim.HopOptimizer`` on the 8x8 digits shipped with scikit-learn (no download). Run it
under mpirun; every rank trains on its own shard with a ``DataLoader``:

    mpirun -n 4 --oversubscribe python3 experiments/mnist_adadelta.py --epochs 3

What the port changed, as a user porting a DDP script would (lines marked ``# hopdec``): the optimizer is
built through ``HopOptimizer(model, optim.Adadelta, ...)`` instead of ``optim.Adadelta(model.parameters(),
...)``; each rank reads its shard (the shards differ in length by one sample: the ranks take different
numbers of steps); ``opt.finish()`` after the epochs; ``test()`` evaluates the consensus model. The
scheduler, ``zero_grad``/``backward``/``step``, the loss and the logging lines are the example's.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from mpi4py import MPI
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

from hopdec.ml.data import load_dataset, partition
from hopdec.optim import HopOptimizer                                  # hopdec


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(256, 128)                                 # 8x8 digits: 64 x 2 x 2 features
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, train_loader, optimizer, epoch, rank):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step(loss=loss)                                     # hopdec: the loss goes to the logs
        if batch_idx % args.log_interval == 0 and rank == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]\tLoss: "
                  f"{loss.item():.6f}", flush=True)


def test(model, test_loader):
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1, keepdim=True).eq(target.view_as(output.argmax(1, keepdim=True))).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)} "
          f"({100. * correct / len(test_loader.dataset):.0f}%)\n", flush=True)
    return test_loss, correct / len(test_loader.dataset)


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example (hopdec port, digits)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--topology", default="ring")                 # hopdec
    parser.add_argument("--log-dir", default=None)                    # hopdec
    args = parser.parse_args()
    comm = MPI.COMM_WORLD                                             # hopdec
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)                                      # the same initial model on every rank

    data = load_dataset("digits", seed=args.seed)
    shard = partition(data.train_y, size, rank, "iid", args.seed)     # hopdec: this rank's shard
    train_loader = DataLoader(TensorDataset(data.train_x[shard], data.train_y[shard]),
                              batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed + rank))
    test_loader = DataLoader(TensorDataset(data.test_x, data.test_y), batch_size=1000)

    model = Net()
    optimizer = HopOptimizer(model, optim.Adadelta, lr=args.lr,       # hopdec
                             topology=args.topology, log_dir=args.log_dir)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, train_loader, optimizer, epoch, rank)
        avg = optimizer.consensus_model(root=0)                       # hopdec: the workers' average
        if rank == 0:
            test(avg, test_loader)
        scheduler.step()
    optimizer.finish()                                                # hopdec
    avg = optimizer.consensus_model(root=0)
    if rank == 0:
        loss, acc = test(avg, test_loader)
        print(f"consensus model: test loss {loss:.4f}, accuracy {acc:.4f}, lr {optimizer.param_groups[0]['lr']:.4g}",
              flush=True)


if __name__ == "__main__":
    main()
