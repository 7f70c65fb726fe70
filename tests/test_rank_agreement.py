"""Before any training message, every rank of ``hopdec train`` checks that it builds the same model and
reads the same run as rank 0 (``hopdec.runtime.setup.first_disagreement``): a topology or data file that
differs between hosts, or a model factory that depends on the rank, is one line naming the rank and what
differs, instead of ``MPI_ERR_IN_STATUS`` or a 120 s peer timeout blaming a peer that "may have died"."""

import textwrap

from hopdec.runtime.setup import first_disagreement
from hopdec.transport.collectives import first_difference

BASE = {"mode": "decentralized", "topology": "7fdf9357b3d3cf85", "dataset": "digits (1437 training samples, "
        "input 1x8x8)", "parameters": [650, 2, 123, 45], "iterations": 6}


def test_ranks_that_agree_pass_and_the_first_that_differs_is_named():
    assert first_disagreement([BASE, dict(BASE), dict(BASE)]) is None
    r, line = first_disagreement([BASE, BASE, dict(BASE, parameters=[715, 2, 9, 45]), dict(BASE, iterations=7)])
    assert r == 2 and line.startswith("the ranks' models differ: rank 0 averages 650 numbers in 2 tensors, rank 2 "
                                      "715 in 2; every rank must build the same model")
    r, line = first_disagreement([BASE, dict(BASE, parameters=[650, 2, 77, 45])])
    assert r == 1 and "rank 0's and rank 1's tensors have the same sizes in all but different shapes" in line
    r, line = first_disagreement([BASE, dict(BASE, parameters=[650, 2, 123, 46])])
    assert r == 1 and "the same shapes but different memory layouts" in line
    r, line = first_disagreement([BASE, BASE, BASE, dict(BASE, topology="a22c82f1c1893432")])
    assert r == 3 and "the topology (its graph's sha256) is 'a22c82f1c1893432' on rank 3, '7fdf9357b3d3cf85' " \
                      "on rank 0" in line and "differs between hosts" in line
    r, line = first_disagreement([BASE, {k: v for k, v in BASE.items() if k != "iterations"}])
    assert r == 1 and "iterations is None on rank 1, 6 on rank 0" in line


def test_the_first_rank_that_differs_from_rank_0_and_where():
    """The one comparison ``hopdec train`` and ``HopOptimizer`` share (models' layouts, topology, settings)."""
    assert first_difference([{"a": 1}, {"a": 1}]) is None and first_difference([[1, 2]]) is None
    assert first_difference([{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 0, "b": 3}, {"b": 9}]) == (2, "a")
    assert first_difference([{"a": 1}, {"a": 1, "z": None}]) == (1, "z")           # a key only one rank has
    assert first_difference([{"a": 1}, {"a": 1, "z": 0}]) == (1, "z")
    assert first_difference([[1, 2], [1, 2], [1, 3]]) == (2, None)


USER = textwrap.dedent('''
    import numpy as np
    from mpi4py import MPI
    from torch import nn

    def by_rank(shape, classes):        # rank 1 builds a wider layer
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 10 + (MPI.COMM_WORLD.rank == 1)))

    def transposed(shape, classes):     # the same numbers, other shapes on rank 1
        n = (64, 10) if MPI.COMM_WORLD.rank == 1 else (10, 64)
        lin = nn.Linear(64, 10, bias=False)
        lin.weight = nn.Parameter(lin.weight.detach().reshape(n))
        return nn.Sequential(nn.Flatten(), lin) if MPI.COMM_WORLD.rank != 1 else _T(lin)

    class _T(nn.Module):
        def __init__(self, lin):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return x.flatten(1) @ self.lin.weight
''')


def test_files_and_factories_that_differ_between_ranks_are_refused_at_setup(mpirun, tmp_path):
    """Each rank runs in a folder of its own (as if on its own host): ``topo.json`` and ``data.py`` are
    different files on rank 2; ``by_rank`` and ``transposed`` build different models on rank 1."""
    from hopdec.topology import generators, graph_io
    for r in range(4):
        d = tmp_path / f"host{r}"
        d.mkdir()
        graph_io.save(generators.complete(4) if r == 2 else generators.ring(4), d / "topo.json")
        rows = 300 if r == 2 else 200
        (d / "data.py").write_text(textwrap.dedent(f'''
            import numpy as np
            def make(seed):
                rng = np.random.default_rng(seed)
                x = rng.normal(size=({rows}, 3)).astype(np.float32)
                y = (x[:, 0] > 0).astype(np.int64)
                return x[:-50], y[:-50], x[-50:], y[-50:]
        '''))
        (d / "mine.py").write_text(USER)
        (d / "seeded.py").write_text(textwrap.dedent(f'''
            import numpy as np
            def make(seed):                 # the same sizes everywhere, other values on rank 2
                rng = np.random.default_rng(seed + {7 if r == 2 else 0})
                x = rng.normal(size=(200, 3)).astype(np.float32)
                y = (x[:, 0] > 0).astype(np.int64)
                return x[:-50], y[:-50], x[-50:], y[-50:]
        '''))
    common = ["--no-progress", "--threads", 1, "--iterations", 4]
    runs = [common + ["--topology", "topo.json"],
            common + ["--dataset", "data.py:make", "--model", "mlp"],
            common + ["--model", "mine.py:by_rank"],
            common + ["--model", "mine.py:transposed"],
            common + ["--dataset", "seeded.py:make", "--model", "mlp"],
            common + ["--dataset", f"{tmp_path}/host0/data.py:make", "--model", "mlp"]]   # one file for all
    prelude = f"import os\nfrom mpi4py import MPI\nos.chdir({str(tmp_path)!r} + f'/host{{MPI.COMM_WORLD.rank}}')\n"
    outs = mpirun.batch(4, runs, timeout=300, prelude=prelude)
    says = ["rank 2 and rank 0 would run different settings: the topology (its graph's sha256) is ",
            "rank 2 and rank 0 would run different settings: dataset is 'data.py:make (250 training samples",
            "the ranks' models differ: rank 0 averages 650 numbers in 2 tensors, rank 1 715 in 2; every rank must "
            "build the same model (the messages are the whole parameter buffer)",
            "the ranks' models differ: rank 0's and rank 1's tensors have the same sizes in all but different "
            "shapes",
            # (the same sizes and shapes: it trained on other data without a word)
            "rank 2 and rank 0 would run different settings: the dataset's contents (a sha256 of its samples) is "]
    for out, text in zip(outs, says):
        lines = [x for x in out.stderr.splitlines() if x.startswith("hopdec train: error:")]
        assert out.returncode == 2 and len(lines) == 1 and text in lines[0], out.stdout + out.stderr
    assert outs[-1].returncode == 0 and "averaged model" in outs[-1].stdout, outs[-1].stdout + outs[-1].stderr
