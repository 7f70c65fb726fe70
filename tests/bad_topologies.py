"""Topology files that must be refused with one line naming the file and the problem.

``BAD_FILES[name] = (file content, text the error must contain)``; used by the library tests
(``test_topology.py``) and the command-line tests (``test_topo_cli.py``) alike. Data, not tests.

``UNTRAINABLE`` has the same shape: files that read fine but cannot mix (not strongly connected over
edges of positive weight). ``load()`` and ``hopdec train`` refuse them with the given text;
``hopdec topo analyze`` reports on them ("strongly connected: no").
"""

import json

_BIG = "1" + "0" * 5000          # more digits than Python converts to an int
_LARGE = 10 ** 400               # an int Python reads, too large for a float


def _nl(edges, nodes=2, directed=True, **attrs):
    """Node-link JSON with nodes 0..nodes-1 and ``edges`` as (source, target[, weight])."""
    return json.dumps({"directed": directed, "nodes": [{"id": i} for i in range(nodes)],
                       "edges": [dict(source=e[0], target=e[1], **({"weight": e[2]} if len(e) > 2 else {}))
                                 for e in edges], **attrs})


BAD_FILES = {
    # found by fuzzing: an OverflowError traceback (a weight too large for a float), a TypeError (a list as
    # a node id, used as a dict key before it was checked), and machine names that crashed the printing
    # of `topo analyze` (a lone surrogate) or reached the terminal raw (an escape sequence)
    "sched_bigweight.json": ('{"steps": [[[0, 1, ' + "9" * 4000 + '], [1, 0, 1]]]}', "weights are finite numbers"),
    "sched_listid.json": (json.dumps({"nodes": [{"id": [0]}, {"id": 1}], "steps": [[[0, 1], [1, 0]]]}),
                          "node ids are the ranks"),
    "machine_surrogate.json": (_nl([(0, 1), (1, 0)]).replace('{"id": 0}', '{"id": 0, "machine": "\\ud800"}'),
                               "printable characters"),
    "machine_escape.json": (_nl([(0, 1), (1, 0)]).replace('{"id": 0}', '{"id": 0, "machine": "\\u001b[31mm0"}'),
                            "printable characters"),
    "trunc.json": ('{"nodes": [', "not valid JSON"),
    "garbage.txt": ("hello world again and again\n", "expected 'src dst [weight]'"),
    "words.txt": ("a b\n", "must be integers"),
    # a networkx user's GraphML, read as an edge list: "node ids must be integers, got '<?xml'"
    "g.graphml": ("<?xml version='1.0' encoding='utf-8'?>\n<graphml xmlns=\"http://graphml.graphdrawing.org/xmlns\">"
                  "\n</graphml>\n", "looks like XML (GraphML?); hopdec reads node-link JSON or an edge list"),
    "outside.json": (json.dumps({"directed": True, "nodes": [{"id": 0}, {"id": 1}],
                                 "edges": [{"source": 0, "target": 1},
                                           {"source": 1, "target": 7}]}), "node 7"),
    "ids.json": (json.dumps({"directed": True, "nodes": [{"id": 1}, {"id": 2}],
                             "edges": [{"source": 1, "target": 2},
                                       {"source": 2, "target": 1}]}), "0..1"),
    "strid.json": (json.dumps({"directed": True, "nodes": [{"id": "a"}, {"id": "b"}],
                               "links": [{"source": "a", "target": "b"}]}), "not an integer"),
    # ids that Python counts equal to an int: the message said "edge 0->0 refers to node 0, which is not
    # one of the 2 nodes (ids 0..1)"; it names the id
    "boolid.json": (_nl([(0, 1), (1, 0)]).replace('{"id": 0}', '{"id": true}'),
                    "node id True (node entry #0) is not an integer"),
    "floatid.json": (_nl([(0, 1), (1, 0)]).replace('{"id": 1}', '{"id": 1.5}'),
                     "node id 1.5 (node entry #1) is not an integer"),
    "boolend.json": (_nl([(0, 1), (1, 0)]).replace('"source": 1', '"source": true'), "refers to node True"),
    "gap.txt": ("0 1\n1 0\n1 3\n3 1\n", "missing [2]"),
    "neg.txt": ("0 1 -0.5\n1 0 1\n0 0 1.5\n", "negative weight"),
    "zero.txt": ("0 1 0\n1 0 1\n0 0 0\n1 1 0\n", "in-weights summing to zero"),
    "some.txt": ("0 1 0.5\n1 0\n", "some edges have weights"),
    "empty.txt": ("# nothing\n", "no edges"),
    "array.json": ("[1, 2, 3]", "not networkx node-link JSON"),
    "nanw.json": ('{"directed": true, "nodes": [{"id": 0}, {"id": 1}], "edges": '
                  '[{"source": 0, "target": 1, "weight": NaN}, '
                  '{"source": 1, "target": 0, "weight": 1}]}', "non-finite"),
    # duplicate edges: an edge list refuses them, and so does JSON (networkx kept the last weight)
    "dupline.txt": ("0 1 0.5\n1 0 1\n0 1 0.9\n", "duplicate edge 0->1"),
    "dupe.json": (_nl([(0, 1, 0.5), (1, 0, 1.0), (0, 1, 0.9)]), "duplicate edge 0->1 (entries #0 and #2"),
    "dupe_undirected.json": (_nl([(0, 1), (1, 0)], directed=False), "duplicate edge 1->0"),
    # hostile numbers: ids and weights too long for Python or for a float, and the error stays short
    "bigid.json": (_nl([(0, 1)]).replace('"target": 1', '"target": ' + _BIG), "number Python will not read"),
    "bigid.txt": (f"0 {_BIG}\n", "node ids must be integers, got '0' '10000000000000000000..."),
    "largeid.json": (_nl([(0, 1), (1, _LARGE)], nodes=2).replace(
        '{"id": 1}', '{"id": 1}, {"id": %d}' % _LARGE), "out of range [<an integer of 401 digits>]"),
    "largew.json": (_nl([(0, 1, _LARGE), (1, 0, 1)]), "weight too large for a float"),
    "infw.txt": ("0 1 1e400\n1 0 1\n", "non-finite weight"),
    # deep nesting: the JSON parser's recursion limit is an error, not a RecursionError traceback
    "deep.json": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "deepattr.json": ('{"directed": true, "nodes": [{"id": 0, "x": ' + "[" * 100_000 + "]" * 100_000
                      + '}], "edges": []}', "nested too deeply"),
}

UNTRAINABLE = {
    "notsc.txt": ("0 1\n1 2\n2 1\n", "node 0 hears from no other worker"),
    "oneway.txt": ("0 1\n1 0\n1 2\n2 3\n3 2\n", "no directed path from node 2 to node 0"),
    # weight 0 is no edge: a graph whose only positive weights are self-loops cannot mix at all
    "allzero.txt": ("0 1 0\n1 0 0\n0 0 1\n1 1 1\n", "node 0 hears from no other worker"),
    "zeroback.txt": ("0 1 1\n1 0 0\n1 2 1\n2 1 1\n0 0 1\n1 1 1\n2 2 1\n", "node 0 hears from no other"),
}
