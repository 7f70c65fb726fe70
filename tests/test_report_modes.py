"""``hopdec report`` / ``trace`` on every mode and mechanism, as a user runs them (simulated runs in process):
what the pages and timelines say must match what the run did and what its own summary printed."""

import io
import json

import pytest

from hopdec.report.data import Run


def simulate(tmp_path, *argv):
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate as run
    out = io.StringIO()
    res = run(parse([str(a) for a in argv] + ["--log-dir", str(tmp_path)]), out=out)
    return res, out.getvalue()


def records(tmp_path, rank):
    return [r for r in map(json.loads, open(tmp_path / f"rank{rank}.jsonl")) if "iter" in r]


def page(runs):
    from hopdec.report.html import render
    return render(runs)


# ---- traffic -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compress", ["none", "int8", "topk:0.1"])
def test_bytes_sent_are_what_the_records_say_they_sent(tmp_path, compress):
    """The counters' "MB sent" was "–" for every simulated run (it read a header field the simulator does not
    write) and ignored --compress's keys; the records carry what each iteration put on the wire."""
    simulate(tmp_path, "--topology", "ring", "-n", 4, "--iterations", 10, "--compress", compress)
    c = Run.load(str(tmp_path)).counters()
    for w in range(4):
        assert c[w]["bytes_sent"] == pytest.approx(sum(r["sent_bytes"] for r in records(tmp_path, w)))
        assert c[w]["bytes_sent"] > 0


def test_compressed_runs_send_fewer_bytes_in_the_report(tmp_path):
    simulate(tmp_path / "a", "--topology", "ring", "-n", 4, "--iterations", 30)
    simulate(tmp_path / "b", "--topology", "ring", "-n", 4, "--iterations", 30, "--compress", "int8")
    full, coded = (Run.load(str(tmp_path / d)).counters()[0]["bytes_sent"] for d in "ab")
    assert coded < full / 2


def test_an_all_reduce_runs_counters_are_its_own(tmp_path):
    """The counters of an all-reduce run were Hop's (updates used "–", messages sent 0, MB sent 0 on a real
    run, fewest tokens "–"): they are the iterations and the gradient bytes all-reduced."""
    simulate(tmp_path, "--mode", "allreduce", "-n", 4, "--iterations", 12, "--slowdown", "rank=2,factor=3")
    run = Run.load(str(tmp_path))
    c = run.counters()
    grad = 151306 * 4                                 # the cnn's gradient, float32
    assert run.message_bytes == grad
    assert all(c[w]["iterations"] == 12 and c[w]["bytes_reduced"] == 12 * grad for w in range(4))
    assert c[0]["wait_s"] > c[2]["wait_s"]            # the others wait for rank 2
    html = page([run])
    counters = html[html.index("Mechanism counters"):]
    counters = counters[:counters.index("</table>")]
    assert "MB all-reduced" in counters
    assert not any(k in counters for k in ("updates used", "fewest tokens", "messages sent"))


def test_a_real_all_reduce_runs_bytes_come_from_its_header(tmp_path):
    header = dict(mode="allreduce", workers=2, iterations=3, gap_bound=1, message_bytes=1000)
    for r in range(2):
        with open(tmp_path / f"rank{r}.jsonl", "w") as f:
            f.write(json.dumps({"rank": r, "run": header}) + "\n")
            for k in range(3):
                f.write(json.dumps(dict(rank=r, iter=k, time=float(k), compute_s=0.5, wait_s=0.5)) + "\n")
    c = Run.load(str(tmp_path)).counters()
    assert c[0]["bytes_reduced"] == 3000 and c[1]["wait_s"] == pytest.approx(1.5)


# ---- the parameter server ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sync", ["asp", "backup", "ssp", "bsp"])
def test_dropped_gradients_are_the_servers(tmp_path, sync):
    """A worker's last gradient, computed after the budget was reached and discarded, was counted as dropped
    (ASP: "dropped 1" on three workers while the server said 0) and shown as "max staleness -1"."""
    simulate(tmp_path, "--mode", "ps", "--sync", sync, "-n", 4, "--iterations", 20, "--compute-time", 0.1,
             "--slowdown", "rank=2,factor=3")
    run = Run.load(str(tmp_path))
    server = next(e for e in run.events_of("summary", 0))
    c = run.counters()
    assert sum(c[w]["dropped"] for w in c) == server["dropped"]
    assert all(c[w]["staleness_max"] is None or c[w]["staleness_max"] >= 0 for w in c)
    from hopdec.report import plots
    plt = plots.matplotlib()
    fig, ax = plt.subplots()
    plots.staleness(ax, run)
    assert ax.get_title() == f"staleness ({server['dropped']} dropped)"
    plt.close(fig)
