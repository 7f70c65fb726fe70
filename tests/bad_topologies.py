"""Topology files that must be refused with one line naming the file and the problem.

``BAD_FILES[name] = (file content, text the error must contain)``; used by the library tests
(``test_topology.py``) and the command-line tests (``test_topo_cli.py``) alike. Data, not tests.
"""

import json

BAD_FILES = {
    "trunc.json": ('{"nodes": [', "not valid JSON"),
    "garbage.txt": ("hello world again and again\n", "expected 'src dst [weight]'"),
    "words.txt": ("a b\n", "must be integers"),
    "outside.json": (json.dumps({"directed": True, "nodes": [{"id": 0}, {"id": 1}],
                                 "edges": [{"source": 0, "target": 1},
                                           {"source": 1, "target": 7}]}), "node 7"),
    "ids.json": (json.dumps({"directed": True, "nodes": [{"id": 1}, {"id": 2}],
                             "edges": [{"source": 1, "target": 2},
                                       {"source": 2, "target": 1}]}), "0..1"),
    "strid.json": (json.dumps({"directed": True, "nodes": [{"id": "a"}, {"id": "b"}],
                               "links": [{"source": "a", "target": "b"}]}), "not an integer"),
    "gap.txt": ("0 1\n1 0\n1 3\n3 1\n", "missing [2]"),
    "notsc.txt": ("0 1\n1 2\n2 1\n", "not strongly connected"),
    "neg.txt": ("0 1 -0.5\n1 0 1\n0 0 1.5\n", "negative weight"),
    "zero.txt": ("0 1 0\n1 0 1\n0 0 0\n1 1 0\n", "in-weights summing to zero"),
    "some.txt": ("0 1 0.5\n1 0\n", "some edges have weights"),
    "empty.txt": ("# nothing\n", "no edges"),
    "array.json": ("[1, 2, 3]", "not networkx node-link JSON"),
    "nanw.json": ('{"directed": true, "nodes": [{"id": 0}, {"id": 1}], "edges": '
                  '[{"source": 0, "target": 1, "weight": NaN}, '
                  '{"source": 1, "target": 0, "weight": 1}]}', "non-finite"),
}
