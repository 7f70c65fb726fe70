"""In-process references the MPI tests compare against."""

import torch


def synchronous_averaging(trainers, iterations):
    """Run ``trainers`` as complete-graph (or BSP) training does: every iteration each computes its
    gradient, all parameters are replaced by their plain average, and each applies its gradient."""
    n = len(trainers)
    for _ in range(iterations):
        for t in trainers:
            t.compute()
        with torch.no_grad():
            mean = torch.zeros_like(trainers[0].flat)
            for t in trainers:
                mean.add_(t.flat, alpha=1.0 / n)
            for t in trainers:
                t.flat.copy_(mean)
        for t in trainers:
            t.apply()
    return trainers
