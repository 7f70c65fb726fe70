"""What ``hopdec topo generate`` writes, byte for byte: the files of every kind are pinned, so that making the
generators, the weights or the writers faster cannot change a file a user has (or a run's fingerprint).

The digests were taken from the code before the speed-ups of ``experiments/bench_generate.py`` (commit
30dcbac): a change that alters any byte of any of these files fails here. Two small files are pinned in
full, so that a failure shows what changed; the rest by the first 128 bits of their sha256. (networkx 3.6's
``node_link_data`` decides the order of a static file's keys: another networkx may fail here too.)
"""

import contextlib
import hashlib
import io

import pytest

from hopdec.cli.topo import main

ONE_PEER_8 = """\
{"schedule": "one_peer_exponential_8", "directed": true, "period": 3,
 "nodes": [{"id": 0}, {"id": 1}, {"id": 2}, {"id": 3}, {"id": 4}, {"id": 5}, {"id": 6}, {"id": 7}],
 "steps": [
  [[0, 0, 0.5], [0, 1, 0.5], [1, 1, 0.5], [1, 2, 0.5], [2, 2, 0.5], [2, 3, 0.5], [3, 3, 0.5], [3, 4, 0.5], [4, 4, 0.5], [4, 5, 0.5], [5, 5, 0.5], [5, 6, 0.5], [6, 6, 0.5], [6, 7, 0.5], [7, 0, 0.5], [7, 7, 0.5]],
  [[0, 0, 0.5], [0, 2, 0.5], [1, 1, 0.5], [1, 3, 0.5], [2, 2, 0.5], [2, 4, 0.5], [3, 3, 0.5], [3, 5, 0.5], [4, 4, 0.5], [4, 6, 0.5], [5, 5, 0.5], [5, 7, 0.5], [6, 0, 0.5], [6, 6, 0.5], [7, 1, 0.5], [7, 7, 0.5]],
  [[0, 0, 0.5], [0, 4, 0.5], [1, 1, 0.5], [1, 5, 0.5], [2, 2, 0.5], [2, 6, 0.5], [3, 3, 0.5], [3, 7, 0.5], [4, 0, 0.5], [4, 4, 0.5], [5, 1, 0.5], [5, 5, 0.5], [6, 2, 0.5], [6, 6, 0.5], [7, 3, 0.5], [7, 7, 0.5]]
 ]
}
"""

RING_3 = """\
{"directed": true, "multigraph": false, "graph": {"name": "ring_3", "weights": "eq1"},
 "nodes": [
  {"id": 0},
  {"id": 1},
  {"id": 2}
 ],
 "edges": [
  {"weight": 0.3333333333333333, "source": 0, "target": 0},
  {"weight": 0.3333333333333333, "source": 0, "target": 1},
  {"weight": 0.3333333333333333, "source": 0, "target": 2},
  {"weight": 0.3333333333333333, "source": 1, "target": 0},
  {"weight": 0.3333333333333333, "source": 1, "target": 1},
  {"weight": 0.3333333333333333, "source": 1, "target": 2},
  {"weight": 0.3333333333333333, "source": 2, "target": 0},
  {"weight": 0.3333333333333333, "source": 2, "target": 1},
  {"weight": 0.3333333333333333, "source": 2, "target": 2}
 ]
}
"""

PINNED = [   # (kind, -n, other options, sha256 of the file written, first 32 hex digits)
    ('ring', 8, '', 'da8fa73d1c49a888bd5ee79b0f05e660'),
    ('ring', 8, '--weights metropolis', '5d4c12a7473d365c5ece2975f7e3ae13'),
    ('ring-based', 8, '', '6df52eda3b496a7f60112636d41227bc'),
    ('ring-based', 8, '--weights metropolis', 'e90cb3d71a0ebf50ad5e7aa025f5c36b'),
    ('double-ring', 8, '', 'e972632566ea7e20acb2eeeb88fce967'),
    ('double-ring', 8, '--weights metropolis', '116f95faef7ae4fee30377353730f63e'),
    ('exponential', 8, '', '08629685c8c4cec632959333ebfe24e0'),
    ('torus', 8, '', '019cb07990ddc9e286b7d44517f03871'),
    ('torus', 8, '--weights metropolis', '81ebf57ce6a46e3995562241ef22a420'),
    ('complete', 8, '', '265ca655fa588cc650588ba91c072633'),
    ('complete', 8, '--weights metropolis', 'a9b97aa61a13bf6d326a52c376079bb0'),
    ('hierarchical-a', 8, '', 'c3f268204f6749688ba2ed0e2e7e7ad8'),
    ('hierarchical-a', 8, '--weights metropolis', '19d9d02a4e5b595f9c1671ea7e254ada'),
    ('hierarchical-b', 8, '', 'f2aac6e09eefa295b94bed08f4a86276'),
    ('hierarchical-b', 8, '--weights metropolis', '715711b5aafeee426edc32fb7e88991f'),
    ('one-peer-exponential', 8, '', '3ec47c805883b6348e8271fd7c2a1a4e'),
    ('ring', 8, '--machines 4,4', '1c1b00a60569ed7f8a480b24b027b970'),
    ('exponential', 8, '--machines 3,5', '9d6b1fbeb81be232cd49d2c02e8dac47'),
    ('ring', 12, '', '18edce5307cb74b735936dcc1c968797'),
    ('ring', 12, '--weights metropolis', 'ca30adea89a3a215b251bf90ae4061d7'),
    ('ring-based', 12, '', '558d6d550ffa3b5596a4cf2f0b0013fc'),
    ('ring-based', 12, '--weights metropolis', '6da600818618b7ad07dfd282b1286e21'),
    ('double-ring', 12, '', 'a3070763a2a8d8eb63ee26bab8181825'),
    ('double-ring', 12, '--weights metropolis', '4f6d08516ea08cc9fed72b1408013cdc'),
    ('exponential', 12, '', 'a2c59f4cf184f516648bce53dacd42f8'),
    ('torus', 12, '', 'bfd7fda29e1a96d5a1304b09da2aa29e'),
    ('torus', 12, '--weights metropolis', '8b9c189fb706d197bcb43c779ad8f4c6'),
    ('complete', 12, '', 'e371b79c7882b7de56845861bd114de8'),
    ('complete', 12, '--weights metropolis', '9a287489c4c36b4f42e72b5bc39655ab'),
    ('hierarchical-a', 12, '', '30e00e5a6bc26edb8049c648e66ee3f4'),
    ('hierarchical-a', 12, '--weights metropolis', 'f103c8670fa68c493ddcc314bf5d4c32'),
    ('hierarchical-b', 12, '', '1c3e3f2a49dcd723ace7e3c19b5d2e20'),
    ('hierarchical-b', 12, '--weights metropolis', 'ffb687de07ead49717b686c81f1bb0ed'),
    ('one-peer-exponential', 12, '', '2ccff390de3a49ecbf2c1ed8d749b7e9'),
    ('ring', 12, '--machines 6,6', '5f734b6fe6f9e59138826e0410095d55'),
    ('exponential', 12, '--machines 3,9', '66fa3d70e15ffdb61d3b0f36b30940b0'),
    ('ring', 16, '', '5d65093a79c1b966ad35eb25b039c068'),
    ('ring', 16, '--weights metropolis', '2b48f795383939294aa6bf766f8ba056'),
    ('ring-based', 16, '', 'd2de19910acf3665dd16e9e19e17ff53'),
    ('ring-based', 16, '--weights metropolis', 'cba4fe4947fd6674b331e2e9213d27fd'),
    ('double-ring', 16, '', 'f5b1e4df45b26f93eb19bff6244366b2'),
    ('double-ring', 16, '--weights metropolis', '88c9057fb0c9d72f40103790976598e9'),
    ('exponential', 16, '', '74c2c74f13e84faf2ae59a016aef48f8'),
    ('torus', 16, '', 'ab29567ed5539213f9e68d83c41857c3'),
    ('torus', 16, '--weights metropolis', '67e296324286c409a554efac44e9f8cb'),
    ('complete', 16, '', '1dc22af543cc97fe2099d2f1ed7fb94a'),
    ('complete', 16, '--weights metropolis', '60c895ccece7bf86a648701a2868d970'),
    ('hierarchical-a', 16, '', 'd2cbb2351f9b6c5ceba3352daf6aa51d'),
    ('hierarchical-a', 16, '--weights metropolis', '8190d7586da60f907a70e9786705efa0'),
    ('hierarchical-b', 16, '', '83341886420b26ee2cd405692924e576'),
    ('hierarchical-b', 16, '--weights metropolis', 'ac27a3a57cf0511d6d13cbbca26a41a0'),
    ('one-peer-exponential', 16, '', '12adabbd634608e6480b6e77b8fe60de'),
    ('ring', 16, '--machines 8,8', '91acfbbc8b38a228c504ba542b8457fd'),
    ('exponential', 16, '--machines 3,13', 'a6fe38c9253a3d6dd86b8627f0997c75'),
    ('ring', 1, '', 'a890c1f8f6cd5fbe9cbe10cd8d59b130'),
    ('exponential', 1, '', 'c0211a570c213548ee6591bb09a06e48'),
    ('complete', 1, '', 'b54ea9697c5b1013641fc9ffb804e856'),
    ('ring', 2, '', 'b1841119f40a962bf8ccb9dde880f1f0'),
    ('exponential', 2, '', 'f98154cb4063a240152743efb522c8c7'),
    ('one-peer-exponential', 2, '', 'f2ed33306e4c2bc92e65a86af086daee'),
    ('complete', 2, '', '52159757aaeef628552b02c4637f282c'),
    ('ring', 3, '', '0efc61c4c7e3eab9204ac31c2481153a'),
    ('exponential', 3, '', 'c76b475856bd20c65c26099f4d3d59f4'),
    ('one-peer-exponential', 3, '', '9ee43321bf58373430dcbe95c6bcceac'),
    ('complete', 3, '', 'c47d4d6be2e0954137914a5450e441ae'),
    ('ring', 5, '', 'bc78f5ef84f86f6522f6b83c7e328a6f'),
    ('exponential', 5, '', '9f7d4b155670760a4854314eaf74b766'),
    ('one-peer-exponential', 5, '', '433ccb25ad4908788da6fe880e6ef3b3'),
    ('complete', 5, '', '830637a0025f92f6194213378f16a6a1'),
    ('ring', 6, '', 'f1044bad98d27a4bb48946ab0cd7369f'),
    ('exponential', 6, '', 'd1cdba161e2a02ea227ce93109dfdfdd'),
    ('one-peer-exponential', 6, '', '1758efa68ed58efcbab5ffcb47877c1e'),
    ('complete', 6, '', '8a8f5a5216993faa28745b9e6e872a5f'),
    ('ring', 7, '', 'b412f084e3b3b12257c2d82792d9a61b'),
    ('exponential', 7, '', '02df2825a61882f7bc30fe42b916cf4e'),
    ('one-peer-exponential', 7, '', '0252eb2fc3bd963b8e132de8bff75488'),
    ('complete', 7, '', '8976a5ae03b81d60b7c6afd7c3270d9e'),
    ('torus', 4, '', '0e7088acde84593203206d6beb51793b'),
    ('torus', 4, '--weights metropolis', 'f308e0614d0884873f44a654c4031168'),
    ('torus', 6, '', '8f03e34d3b0878c9a168568c6260aaa6'),
    ('torus', 6, '--weights metropolis', 'bd7e092576b0dcf48dd20ca6872ccc23'),
    ('torus', 9, '', '3978e8acc83132cdcb3d779321d92661'),
    ('torus', 9, '--weights metropolis', '9be03e02d2226d1524f1fe36559d5e62'),
    ('torus', 10, '', '490d4d4b38a4fd39c4f414dbddcb1228'),
    ('torus', 10, '--weights metropolis', 'adbe65fc16761d70698bef9385b754be'),
    ('torus', 100, '', '20fb452359121106bca87bae70933d0c'),
    ('torus', 100, '--weights metropolis', 'f8c3131184680a5a626f20b98698b4d0'),
    ('hierarchical-a', None, '--machines 4,2,2', 'c3f268204f6749688ba2ed0e2e7e7ad8'),
    ('hierarchical-b', None, '--machines 3,3,2', 'c7b075228cc891541dd2a149810152d8'),
    ('hierarchical-b', None, '--machines 5,1,7,2', 'c6885ac1c95049132e9428c3061a1cb8'),
    ('hierarchical-a', None, '--machines 5,1', '356c270819f605099082a9ca2485ec23'),
    ('hierarchical-b', None, '--machines 6', 'dd33ecb59b9ec6c7340815291a25dd59'),
    ('hierarchical-a', None, '--machines 1,1', '9f7c9e3d30eb32ff8d9c683c92e59e51'),
    ('hierarchical-b', 100, '--weights metropolis', '1acf40dfb8ec196526fd3f38a763a126'),
    ('hierarchical-a', 100, '', 'd9e8b0e74ad560b336b1343db58e0b4d'),
    ('complete', 100, '', '39e3a0dfa9be19d99c84bf5df12d1739'),
    ('complete', 100, '--weights metropolis', '0140b4d01e4b802879e8f67bb52313d3'),
    ('one-peer-exponential', 1000, '', '18fa4ae673d47cbc8a0b41b4fb1891f6'),
    ('exponential', 1000, '', 'a2be30ff573acea63defb89e5324f39b'),
    ('ring-based', 1000, '', '9f6dc8bd841bb4a7dbb082b4597ebd91'),
    ('double-ring', 1000, '--weights metropolis', '528fd10d6c68f32455bbcd10d7ead386'),
    ('torus', 1000, '--weights metropolis', '20b9daf32aaeef5d3317a60ce2d9892d'),
    ('ring', 1000, '--machines 250,750', 'cfc8ddc9fdbb9230cb599507c4f6f80e'),
    ('one-peer-exponential', 1024, '', '2ac03477ab8f2f05dabe4e3c0e5c4328'),
    ('exponential', 1024, '', '2ba65064661fd1b3037afd0548b0da95'),
    ('ring-based', 1024, '', '2b0638c5e521a256d0c1dae63bae09f5'),
    ('double-ring', 1024, '--weights metropolis', 'e913fe9ae02336066f778379a5109af0'),
    ('torus', 1024, '--weights metropolis', '4289be009cfdf4e9270c313973037c43'),
    ('ring', 1024, '--machines 256,768', '40aca26e1e3167d32794b93fea00f84a'),
    ('one-peer-exponential', 3, '', '9ee43321bf58373430dcbe95c6bcceac'),
    ('one-peer-exponential', 5, '', '433ccb25ad4908788da6fe880e6ef3b3'),
    ('one-peer-exponential', 17, '', '3c9d2024e23bbcbde3235ff6f1de5597'),
    ('one-peer-exponential', 31, '', '3c011cb1684f448b4142a009d2d05523'),
    ('one-peer-exponential', 33, '', 'd52669f31ad982287885dbec683d34c8'),
    ('one-peer-exponential', 100, '', 'c3f23917f1c9ae36e668349ee89776b9'),
    ('one-peer-exponential', 129, '', '99379e9ab516dd24e254aa8a05d21027'),
]


def generate(tmp_path, kind, n, extra=()):
    out = tmp_path / "g.json"
    argv = ["generate", kind] + (["-n", str(n)] if n is not None else []) + list(extra) + ["-o", str(out)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv
    return out.read_bytes()


def test_one_peer_exponential_8_in_full(tmp_path):
    assert generate(tmp_path, "one-peer-exponential", 8).decode() == ONE_PEER_8


def test_ring_3_in_full(tmp_path):
    assert generate(tmp_path, "ring", 3).decode() == RING_3


@pytest.mark.parametrize("kind,n,extra,digest", PINNED,
                         ids=[f"{k}-{n}{'-' + e.replace(' ', '') if e else ''}" for k, n, e, _ in PINNED])
def test_generated_file_is_unchanged(tmp_path, kind, n, extra, digest):
    data = generate(tmp_path, kind, n, extra.split())
    assert hashlib.sha256(data).hexdigest()[:32] == digest


def _facts(G):
    """Everything code can see of a DiGraph: nodes, edges with data, each node's successors and predecessors
    in order, the graph's attributes in order."""
    return ([(v, d) for v, d in G.nodes(data=True)], [(u, v, d) for u, v, d in G.edges(data=True)],
            [list(G.successors(v)) for v in G.nodes], [list(G.predecessors(v)) for v in G.nodes],
            list(G.graph.items()))


def _edge_by_edge(n, edges, name, bidirectional=False):
    """The generators' graphs as they were built: add_edge per edge, then with_default_weights's copy."""
    import networkx as nx
    from hopdec.topology.weights import with_default_weights
    G = nx.DiGraph(name=name)
    G.add_nodes_from(range(n))
    for u, v in edges:
        u, v = u % n, v % n
        if u != v:
            G.add_edge(u, v)
            if bidirectional:
                G.add_edge(v, u)
    return with_default_weights(G)


@pytest.mark.parametrize("kind,n", [("ring", 1), ("ring", 2), ("ring", 9), ("ring-based", 10), ("double-ring", 12),
                                    ("exponential", 1), ("exponential", 13), ("torus", 12), ("complete", 5),
                                    ("hierarchical-a", 9), ("hierarchical-b", 11)])
def test_the_generators_build_the_graphs_they_built_edge_by_edge(kind, n, monkeypatch):
    """Not only the file: each node's successors and predecessors come in the same order (the in-weights a
    worker's Reduce sums, in that order), with the same weights and attributes."""
    from hopdec.topology import generators
    real, seen = generators._from_edges, []

    def both(n, edges, name, bidirectional=False):
        edges = list(edges)
        G = real(n, edges, name, bidirectional)
        assert _facts(G) == _facts(_edge_by_edge(n, edges, name, bidirectional))
        seen.append(name)
        return G
    monkeypatch.setattr(generators, "_from_edges", both)
    generators.GENERATORS[kind](n)
    assert seen


def _node_link_save(G, path):
    """``topology.save`` as it was: a sorted copy through nx.node_link_data, json.dumps per node and edge."""
    import json
    import networkx as nx
    H = nx.DiGraph()
    H.graph.update({k: v for k, v in G.graph.items() if k != "source"})
    H.add_nodes_from((int(v), dict(d)) for v, d in sorted(G.nodes(data=True)))
    H.add_edges_from(sorted((int(u), int(v), {**d, "weight": float(d["weight"])})
                            if "weight" in d else (int(u), int(v), dict(d))
                            for u, v, d in G.edges(data=True)))
    data = nx.node_link_data(H, edges="edges")
    head = {k: v for k, v in data.items() if k not in ("nodes", "edges")}
    parts = ["{" + json.dumps(head)[1:-1] + ","]
    for key in ("nodes", "edges"):
        items = [f"  {json.dumps(x)}" for x in data[key]]
        tail = "," if key == "nodes" else ""
        parts.append(f' "{key}": [\n' + ",\n".join(items) + "\n ]" + tail)
    parts.append("}\n")
    with open(path, "w") as fh:
        fh.write("\n".join(parts))


def test_save_writes_what_node_link_data_wrote(tmp_path):
    """Random graphs with node attributes (machine, backup_workers, others), edges with other attributes
    (bandwidth, latency, a label, no weight), weights of every kind (0.0, -0.0, 1/3, 1e-300, integers), nodes
    added out of order: the same bytes as the writer through nx.node_link_data."""
    import random

    import networkx as nx
    from hopdec.topology.graph_io import save
    rng = random.Random(4)
    for case in range(200):
        n = rng.randint(1, 9)
        G = nx.DiGraph(name=f"g{case}", **({"weights": "file", "source": "x.json"} if case % 2 else {}))
        for v in rng.sample(range(n), n):
            G.add_node(v, **rng.choice([{}, {"machine": f"m{v % 2}"}, {"backup_workers": 1, "label": "x"}]))
        for u in range(n):
            for v in range(n):
                if rng.random() < 0.4:
                    d = rng.choice([{"weight": rng.choice([0.5, 0.0, -0.0, 1 / 3, 1e-300, 2, 1.0])},
                                    {"weight": 0.25, "bandwidth": 10}, {"latency": 0.001}, {"label": "e", "weight": 1}])
                    G.add_edge(u, v, **d)
        save(G, tmp_path / "new.json")
        _node_link_save(G, tmp_path / "old.json")
        assert (tmp_path / "new.json").read_bytes() == (tmp_path / "old.json").read_bytes(), case
