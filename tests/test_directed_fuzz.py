"""Random directed graphs and hostile topology files through the tools, beyond the shipped examples.

Each test here reproduces something the fuzzing of ``hopdec topo analyze``, ``hopdec sim``, ``hopdec train``
and ``HopOptimizer`` with seeded random strongly connected directed graphs (both file formats, with and
without weights, some workers keeping self-weight 0) found broken.
"""

import io

import pytest

from hopdec.hop.receive import SELF, Stale, Standard
from hopdec.hop.update_queue import Entry


def test_a_stale_reduce_with_nothing_fresh_keeps_the_own_parameters_of_a_zero_self_weight_worker():
    """Worker 0 gives its own parameters weight 0 (the file's self-loop) and hears from worker 1 only. With
    staleness 0, worker 1's update of iteration 1 is used in Reduce(0) (it is fresh enough); Recv(1) is then
    satisfied (the newest seen is 1) but nothing fresh is left: Reduce(1) had only the zero-weight own term
    and divided by zero (ZeroDivisionError out of ``hopdec sim --staleness 0``). The local update is always
    available (Hop sec. 3.1): a Reduce with nothing of positive weight keeps the own parameters."""
    p = Stale(0, {0: 0.0, 1: 1.0}, staleness=0)
    p.on_update(Entry(1, 1, "u1"))
    first = p.plan(0)
    assert [(t.sender, t.handle, t.weight) for t in first] == [(0, SELF, 0.0), (1, "u1", 1.0)]
    again = p.plan(1)
    assert again is not None and [(t.sender, t.handle, t.weight) for t in again] == [(0, SELF, 1.0)]


def test_a_healed_standard_reduce_waiting_for_nobody_keeps_the_own_parameters():
    """After a heal a sender's updates older than its iteration are not waited for; a worker with self-weight
    0 whose only sender is such one has nothing of positive weight in Reduce(k) (``hopdec sim
    --fault-tolerance --deaths`` ended in ZeroDivisionError): it keeps its own parameters."""
    p = Standard(0, {0: 0.0, 1: 1.0}, slots=4)
    p.reconfigure({0: 0.0, 1: 1.0}, {1: 5})
    terms = p.plan(3)
    assert terms is not None and [(t.sender, t.handle, t.weight) for t in terms] == [(0, SELF, 1.0)]


def _topo(*args):
    from test_topo_cli import topo
    return topo(*args)


@pytest.mark.parametrize("json_out", [False, True])
def test_analyze_reports_a_schedule_whose_union_is_not_strongly_connected(tmp_path, json_out):
    """A schedule whose union leaves node 2 out: ``topo analyze`` ended in a KeyError traceback (the text
    report wanted the schedule's Table 1, which was computed only for strongly connected unions) and
    ``--json`` gave the union's *static* bounds under the schedule's name. Now both report the schedule's
    bounds, inf where unbounded, as for a static graph that is not strongly connected."""
    import json
    path = tmp_path / "isolated.json"
    path.write_text(json.dumps({"steps": [[[0, 1]], [[1, 0]]], "nodes": [{"id": i} for i in range(3)]}))
    r = _topo("analyze", path, *(["--json"] if json_out else []))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "not strongly connected" in r.stderr
    if json_out:
        b = json.loads(r.stdout)["gap_bounds"]
        assert b["skip+tokens"] == "inf" and b["standard"] == "inf" and b["notify-ack"] is None
    else:
        assert "Hop Table 1 on the time-varying graph" in r.stdout and "M = W_0 W_1)" in r.stdout


@pytest.mark.parametrize("value", ['"false"', "0", "null", "[]"])
def test_node_link_directed_must_be_a_boolean(tmp_path, value):
    """``"directed": "false"`` read as true (Python's bool of a non-empty string): a one-way 3-cycle the user
    meant undirected was trained as directed, silently. Like a schedule file's, it must be true or false."""
    path = tmp_path / "d.json"
    path.write_text('{"directed": %s, "nodes": [{"id": 0}, {"id": 1}, {"id": 2}], "edges": '
                    '[{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 2, "target": 0}]}' % value)
    r = _topo("analyze", path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and str(path) in lines[0], r.stderr
    assert "'directed' must be true or false" in lines[0]
