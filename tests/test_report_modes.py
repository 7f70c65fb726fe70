"""``hopdec report`` / ``trace`` on every mode and mechanism, as a user runs them (simulated runs in process):
what the pages and timelines say must match what the run did and what its own summary printed."""

import io
import json
import re

import numpy as np
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


def _counters_table(html):
    counters = html[html.index("Mechanism counters"):]
    table = counters[:counters.index("</table>")]
    rows = [re.findall(r"<t[hd]>(.*?)</t[hd]>", row) for row in table.split("<tr>")[1:]]
    return rows[0], rows[1:], counters


def test_bytes_are_mib_and_say_so(tmp_path):
    """The counters said "MB sent" in 10^6 bytes while hopdec sim's times line and --message-mb count MiB:
    a simulated run's 180 messages of 0.5772 MiB read as 108.9 "MB" (103.9 MiB), 4.9% apart without a
    word. Every byte figure a report prints is MiB (2^20 bytes), labelled so."""
    run = _real_run(tmp_path / "a")
    for r in run.records:
        for rec in run.records[r]:
            rec["sent_bytes"] = 3 * 2 ** 20                       # three iterations of 3 MiB each
    head, rows, rest = _counters_table(page([run]))
    col = head.index("MiB sent")
    assert [row[col] for row in rows] == ["9", "9"]
    assert "MiB = 2^20 bytes" in rest[:rest.index("Settings of this run")]
    simulate(tmp_path / "b", "--mode", "allreduce", "-n", 2, "--iterations", 4, "--message-mb", 1.5)
    head, rows, _ = _counters_table(page([Run.load(str(tmp_path / "b"))]))
    assert [row[head.index("MiB all-reduced (gradient)")] for row in rows] == ["6", "6"]


def test_messages_sent_are_what_the_transport_counted(tmp_path):
    """A HopOptimizer loop sends its next iteration's parameters before finish() ends the run: 183 updates
    left each rank of a 60-step loop on a ring-based(4), its records listed 180, and the report said 180 (and
    their bytes) with no word of the rest. The counters take the rank's ``messages`` event (the transport's
    count, what hopdec train's traffic line prints) and say where it differs from the records; a resumed log
    (whose first session's event may be cut) and the simulator (no event) keep the records' sums."""
    run = _real_run(tmp_path / "a", driver="hopdec.optim.HopOptimizer")
    for r in run.records:
        for rec in run.records[r]:
            rec["sent_bytes"] = 2 ** 20
        run.events[r] = [dict(event="messages", updates=4, bytes=4 * 2 ** 20)]
    head, rows, rest = _counters_table(page([run]))
    assert [(row[head.index("messages sent")], row[head.index("MiB sent")]) for row in rows] == [("4", "4")] * 2
    assert "not the sum of its iteration records (rank 0 +1, rank 1 +1 messages)" in rest
    assert "finish()" in rest
    run.resumed_ranks = {0}
    assert [run.counters()[r]["messages_sent"] for r in (0, 1)] == [3, 4]
    run.events[1] = [dict(event="messages", updates="many", bytes=-1)]          # a hostile event: the records
    assert run.counters()[1]["messages_sent"] == 3


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
    assert "MiB all-reduced" in counters
    assert not any(k in counters for k in ("updates used", "fewest tokens", "messages sent"))


def test_an_evaluation_before_the_first_iteration_is_in_the_run(tmp_path):
    """An all-reduce run with --eval-interval evaluates before its first iteration (every worker waits for it),
    but the run started at its first record: the evaluation was drawn at -0.37 s and the duration left out
    the time every worker waited for it."""
    header = dict(mode="allreduce", workers=2, iterations=3, gap_bound=1, message_bytes=1000)
    for r in range(2):
        with open(tmp_path / f"rank{r}.jsonl", "w") as f:
            f.write(json.dumps({"rank": r, "run": header}) + "\n")
            for k in range(3):
                f.write(json.dumps(dict(rank=r, iter=k, time=100.0 + k, compute_s=0.5, wait_s=0.5)) + "\n")
    with open(tmp_path / "eval.jsonl", "w") as f:
        for t, k in ((99.6, 0), (103.2, 3)):
            f.write(json.dumps(dict(time=t, test_acc=0.5, test_loss=1.0, iter_min=k, eval_s=0.4)) + "\n")
    run = Run.load(str(tmp_path))
    assert run.t0 == 99.6 and run.final()["duration"] == pytest.approx(3.4)
    from hopdec.report import plots
    plt = plots.matplotlib()
    fig, ax = plt.subplots()
    plots.accuracy_curves(ax, [run])
    assert list(ax.get_lines()[0].get_xdata()) == pytest.approx([0.0, 3.6])
    plt.close(fig)


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


# ---- what the run was --------------------------------------------------------------------------------------
def _real_run(tmp_path, **header):
    """A real run's logs (no ``simulated``), as hopdec train writes them, with ``header``."""
    head = dict(mode="decentralized", topology="ring(2)", protocol="tokens", setting="standard", iterations=3,
                gap_bound=1, message_bytes=8, **header)
    tmp_path.mkdir(parents=True, exist_ok=True)
    for r in range(2):
        with open(tmp_path / f"rank{r}.jsonl", "w") as f:
            f.write(json.dumps({"rank": r, "run": head}) + "\n")
            for k in range(3):
                f.write(json.dumps(dict(rank=r, iter=k, time=100.0 + k, compute_s=0.5, wait_s=0.5, sent=1,
                                        sent_to=[1 - r])) + "\n")
    return Run.load(str(tmp_path))


def test_an_emulated_run_is_labelled_emulated(tmp_path):
    """A real run with --slowdown/--compute-time printed 'times: EMULATED -- ...' in its summary, but its
    report showed the figures with no word of it (only deep in the settings table)."""
    run = _real_run(tmp_path / "a", emulation="compute padded to 0.01 s/iter; rank 1 3x slower")
    assert run.conditions() == "EMULATED: compute padded to 0.01 s/iter; rank 1 3x slower"
    html = page([run])
    glance = html[html.index("At a glance"):html.index("Training")]
    assert "EMULATED: compute padded to 0.01 s/iter; rank 1 3x slower" in glance
    section = html[html.index('id="run0"'):]
    assert "EMULATED:" in section[:section.index("<img")]
    plain = _real_run(tmp_path / "b", emulation="no emulation")
    assert plain.conditions() is None and "EMULATED:" not in page([plain])


def test_an_emulated_run_whose_compute_outran_the_pad_says_so(tmp_path):
    """A run with --compute-time 0.03 on a loaded machine: its summary said "measured compute exceeded the
    pad in 307 iterations on 4 rank(s), up to 0.163 s", its report only "compute padded to 0.03 s/iter" --
    figures read as taken at 0.03 s of compute were taken at up to 0.163."""
    run = _real_run(tmp_path, emulation="compute padded to 0.01 s/iter; rank 1 3x slower")
    for k, rec in enumerate(run.records[1]):
        rec["measured_compute_s"] = 0.02 if k else 0.005
    run.records[0][2]["measured_compute_s"] = 0.0125
    assert run.conditions() == ("EMULATED: compute padded to 0.01 s/iter; rank 1 3x slower; measured compute "
                                "exceeded the pad in 3 iterations on 2 rank(s), up to 0.02 s (there the "
                                "slowdowns multiplied the measured time)")
    for rec in run.records[1] + run.records[0]:
        rec.pop("measured_compute_s", None)
    assert run.conditions() == "EMULATED: compute padded to 0.01 s/iter; rank 1 3x slower"


def test_an_emulated_network_is_labelled(tmp_path):
    from hopdec.testbed.spec import Host, Link, Testbed
    net = Testbed((Host("a", 1, 100.0), Host("b", 1, 100.0)), {("a", "b"): Link(10.0, 5.0)}).conditions()
    run = _real_run(tmp_path, emulation="no emulation", network=net)
    assert run.conditions().startswith("network EMULATED: 2 hosts")
    assert "10 Mbit/s +5 ms on a-&gt;b" in page([run])          # which link has which setting
    hostile = _real_run(tmp_path / "h", network={"hosts": [1, None, "x"], "links": 3})
    assert "network EMULATED" in hostile.conditions()           # a label, never a traceback


def test_an_emulated_networks_measured_links_are_beside_its_times(tmp_path):
    """A testbed measures its links before the run (and every header keeps it), but the report showed only
    what they were configured for: a link that gave 12 of its 20 Mbit/s read as 20."""
    from hopdec.testbed.spec import Host, Link, Testbed
    net = Testbed((Host("a"), Host("b")), {("a", "b"): Link(20.0, 2.0)}).conditions()
    net["measured"] = [dict(src="a", dst="b", mbit=12.04, rtt_ms_min=4.2, rtt_ms_median=4.35, rtt_ms_max=9.0,
                            configured=dict(mbit=20.0, delay_ms=2.0, rtt_ms=4.0)),
                       dict(src="b", dst="a", mbit="fast")]                     # (unreadable: left out)
    run = _real_run(tmp_path, network=net)
    assert run.measured_links() == "a->b 12 Mbit/s (configured 20), RTT median 4.35 ms (configured 4)"
    section = page([run])
    section = section[section.index('id="run0"'):]
    assert "measured before the run (TCP, one pair per distinct setting): a-&gt;b 12 Mbit/s" in \
        section[:section.index("<img")]


def test_a_simulated_run_shows_its_conditions_beside_the_virtual_label(tmp_path):
    simulate(tmp_path, "--topology", "ring", "-n", 4, "--iterations", 5, "--compute-time", 0.1,
             "--slowdown", "rank=1,factor=3")
    run = Run.load(str(tmp_path))
    assert run.conditions().startswith("compute 0.1 s per iteration; rank 1 3x slower; ")
    assert "EMULATED:" not in page([run])


def test_a_simulated_runs_conditions_include_its_messages_and_network(tmp_path):
    """The report named a simulated run's compute only: its virtual times came as much from the network
    (NICs, latency) and the message size, which its summary's times line gives and the page did not."""
    simulate(tmp_path, "--topology", "ring", "-n", 4, "--iterations", 5, "--compute-time", 0.1,
             "--bandwidth", 0.5, "--latency", 0.002, "--compress", "int8")
    run = Run.load(str(tmp_path))
    assert run.conditions() == ("compute 0.1 s per iteration; messages of 0.5772 MiB coded to 0.1466 MiB; NICs "
                                "0.5 Gb/s per direction (full duplex), latency 0.002 s")
    section = page([run])
    section = section[section.index('id="run0"'):]
    assert "NICs 0.5 Gb/s per direction" in section[:section.index("<img")]
    hostile = Run.from_parts(dict(simulated="SIMULATED", cost_model={"network": "fast", "message_mb": "x"}),
                             {0: [dict(iter=0, time=0.0)]}, {})
    assert hostile.conditions() is None


def test_the_mechanisms_of_a_run_are_in_its_description(tmp_path):
    """A run with --staleness 2 --backup-workers 1 --skip ... was described as 'hybrid (tokens) on ring(8)':
    the glance table could not tell it from another hybrid run."""
    simulate(tmp_path, "--topology", "ring", "-n", 8, "--iterations", 10, "--staleness", 2, "--backup-workers", 1,
             "--skip", "max-jump=2,trigger=2")
    d = Run.load(str(tmp_path)).describe()
    assert d.startswith("hybrid (tokens) on ring(8)")
    for part in ("--staleness 2", "--backup-workers 1", "--skip max-jump=2,trigger=2"):
        assert part in d


# ---- the timeline ------------------------------------------------------------------------------------------
def test_a_trace_rebuilt_from_logs_shows_the_deaths(tmp_path):
    """`hopdec trace RUN_DIR` of a --fault-tolerance run (real or simulated) drew no failure: it looked for the
    live trace's 'failure' events, and the logs hold each survivor's 'heal' events instead."""
    from hopdec.report.trace import build_trace
    simulate(tmp_path, "--topology", "ring", "-n", 6, "--iterations", 40, "--compute-time", 0.1,
             "--fault-tolerance", "--deaths", "2@1.0,4@2.5")
    obj = build_trace(Run.load(str(tmp_path)))
    deaths = [e for e in obj["traceEvents"] if e["ph"] == "i" and e.get("cat") == "failure"]
    assert sorted(e["args"]["failed"] for e in deaths) == [[2], [4]]           # one instant per heal, not per survivor
    assert all(e["s"] == "g" and "died" in e["name"] for e in deaths)


@pytest.mark.parametrize("mode", [[], ["--mode", "allreduce"], ["--local-steps", "2"]])
def test_a_traces_last_iteration_lasts_what_its_record_says(tmp_path, mode):
    """Each worker's last iteration lasted 1 µs (no next record to end it), so the timeline ended before the
    run: 20.0 s against the report's 20.4 s. It now ends at its start plus the record's compute, wait and
    reduce times, as the report's duration does."""
    from hopdec.report.trace import build_trace
    simulate(tmp_path, "-n", 4, "--iterations", 10, "--slowdown", "rank=3,factor=4", *mode)
    run = Run.load(str(tmp_path))
    its = [e for e in build_trace(run)["traceEvents"] if e.get("cat") == "iteration"]
    t0 = run.t0
    for w, recs in run.records.items():
        last = [e for e in its if e["pid"] == w + 1 and e["name"] == f"iteration {recs[-1]['iter']}"]
        want = (recs[-1]["compute_s"] + (recs[-1].get("wait_s") or 0) + (recs[-1].get("reduce_s") or 0)) * 1e6
        assert len(last) == 1 and last[0]["dur"] == pytest.approx(want, abs=0.01) and want > 1000, (w, last, want)
    end = max(e["ts"] + e["dur"] for e in its) / 1e6
    assert end == pytest.approx(run.final()["duration"], rel=1e-6) and run.t0 == t0


def test_esyncs_staleness_comes_from_the_servers_applies(tmp_path):
    """ESync's workers push a round's model delta and their records carry no staleness: the report's staleness
    panel was empty axes and every counter "–", though the server's apply events list each update's
    staleness. The panel and counters now read those."""
    from hopdec.report import plots
    simulate(tmp_path, "--mode", "ps", "--sync", "esync", "-n", 4, "--iterations", 20, "--slowdown",
             "rank=3,factor=4")
    run = Run.load(str(tmp_path))
    applies = [e for e in run.events_of("apply", 0) if e.get("staleness")]
    assert applies and all(not any("staleness" in r for r in recs) for recs in run.records.values())
    want = {w: [x for e in applies for v, x in zip(e["workers"], e["staleness"]) if v == w] for w in run.records}
    assert run.staleness_of() == want and all(want.values())
    c = run.counters()
    for w in run.records:
        assert c[w]["staleness_max"] == max(want[w]) and c[w]["push_interval_s"] > 0
    fig, ax = plots.matplotlib().subplots()
    plots.staleness(ax, run)
    assert sum(p.get_height() for p in ax.patches) == sum(map(len, want.values()))


def test_the_rate_of_a_run_with_deaths_is_its_survivors(tmp_path):
    """The report's iter/s per worker counted a worker that died (8 iterations at its own pace) with the
    survivors, where the run's summary lists only the survivors."""
    simulate(tmp_path, "--topology", "ring", "-n", 6, "--iterations", 40, "--slowdown", "rank=3,factor=4",
             "--fault-tolerance", "--deaths", "5@1.0")
    run = Run.load(str(tmp_path))
    rate = lambda recs: (recs[-1]["iter"] - recs[0]["iter"]) / (recs[-1]["time"] - recs[0]["time"])  # noqa: E731
    alive = [rate(recs) for w, recs in run.records.items() if w != 5]
    assert run.final()["rate"] == pytest.approx(sum(alive) / len(alive))
    assert run.final()["rate"] != pytest.approx(sum(map(rate, run.records.values())) / 6)


def test_a_live_trace_does_not_draw_a_death_twice(tmp_path):
    from hopdec.report.trace import build_trace
    heal = dict(time=5.0, failed=[1], survivors=[0, 2])
    events = {0: [dict(event="failure", **heal), dict(event="heal", **heal)], 2: [dict(event="heal", **heal)]}
    recs = {r: [dict(iter=0, time=0.0), dict(iter=1, time=1.0)] for r in range(3)}
    obj = build_trace(Run.from_parts(dict(mode="decentralized"), recs, events))
    assert sum(e["ph"] == "i" and e.get("cat") == "failure" for e in obj["traceEvents"]) == 1


def test_a_simulated_trace_says_so_in_the_timeline(tmp_path):
    """Perfetto shows the tracks and their names, not otherData: a simulated run's timeline read as a
    measured one."""
    from hopdec.report.trace import build_trace
    simulate(tmp_path, "--topology", "ring", "-n", 4, "--iterations", 5, "--slowdown", "rank=1,factor=3")
    obj = build_trace(Run.load(str(tmp_path)))
    names = [e["args"]["name"] for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert any("SIMULATED" in n and "virtual" in n for n in names)
    assert "rank 1 3x slower" in obj["otherData"]["conditions"]


def test_figures_name_simulated_and_emulated_runs_in_their_legends(tmp_path):
    """`hopdec plot real sim -o loss.png` drew a measured and a simulated run as two alike lines (only the
    shared axis said "simulated runs: virtual s"), and an emulated run as a measured one."""
    from hopdec.report import plots
    simulate(tmp_path / "sim", "--topology", "ring", "-n", 4, "--iterations", 20, "--math")
    sim = Run.load(str(tmp_path / "sim"))
    real = _real_run(tmp_path / "real", emulation="rank 1 3x slower")
    for r in range(2):                                  # give the real run a loss to draw
        recs = [json.loads(x) for x in open(tmp_path / "real" / f"rank{r}.jsonl")]
        with open(tmp_path / "real" / f"rank{r}.jsonl", "w") as f:
            f.writelines(json.dumps({**x, "loss": 1.0} if "iter" in x else x) + "\n" for x in recs)
    real = Run.load(str(tmp_path / "real"))
    plt = plots.matplotlib()
    fig, (a, b) = plt.subplots(1, 2)
    plots.loss_curves(a, b, [real, sim])
    for ax in (a, b):
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["real (EMULATED)", "sim (SIMULATED)"]
    plt.close(fig)
    fig, ax = plt.subplots()
    plots.per_run(ax, real, "timeline")                  # hopdec plot --what timeline
    assert ax.get_title().startswith("real (EMULATED):\n")
    plt.close(fig)


def test_what_watching_cost_is_a_part_of_the_breakdown_not_other(tmp_path):
    """Rank 0 of a run with --consensus-every 10 --eval-interval 1 spent 1.8 s of its 10 s in consensus rounds
    and evaluations between iterations (its observer event measured it: hook_s); the breakdown drew it as
    "other" -- 2.3 s of unexplained time on rank 0 alone."""
    run = _real_run(tmp_path)
    for r in run.records:
        for k, rec in enumerate(run.records[r]):
            rec["time"] = 100.0 + 2 * k                     # 1 s of each 2 s step is in no part of its record
    run.events[0] = [dict(event="observer", hook_s=0.3, records=3, per_record_ms=100.0)]
    run.events[1] = [dict(event="observer", hook_s=5.0, records=3, per_record_ms=1666.0)]   # (more than other)
    b = run.breakdown()
    assert b[0]["watching"] == pytest.approx(0.3) and b[0]["other"] == pytest.approx(1.7)
    assert b[1]["watching"] == pytest.approx(2.0) and b[1]["other"] == 0.0
    assert '"watching": live progress, consensus rounds' in page([run])


def test_a_run_without_a_loss_is_named_with_the_reason(tmp_path):
    """The loss panels of a HopOptimizer loop that passed no loss to step() said "no training loss in these
    logs (a timing-only simulation)"; beside a run with a loss such a run was left out without a word. (And
    its time breakdown called the loop's own time between steps "compute".)"""
    from hopdec.report import plots
    loop = _real_run(tmp_path / "loop", driver="hopdec.optim.HopOptimizer")
    simulate(tmp_path / "sim", "--topology", "ring", "-n", 4, "--iterations", 5)
    sim = Run.load(str(tmp_path / "sim"))
    simulate(tmp_path / "math", "--topology", "ring", "-n", 4, "--iterations", 5, "--math")
    math = Run.load(str(tmp_path / "math"))
    plt = plots.matplotlib()

    def texts(runs):
        fig, (a, b) = plt.subplots(1, 2)
        plots.loss_curves(a, b, runs)
        out = [" ".join(t.get_text() for t in ax.texts) for ax in (a, b)]
        plt.close(fig)
        return out
    for text in texts([loop]):
        assert "loop: a loop of your own: step(loss=...) logs it" in text and "simulation" not in text
    fig, ax = plt.subplots()                  # what a loop's records call compute is its own time between steps
    plots.breakdown(ax, loop)
    assert [t.get_text() for t in ax.get_legend().get_texts()][0] == "your loop (between steps)"
    plt.close(fig)
    for text in texts([math, sim, loop]):
        assert text == ("no training loss logged:\nsim (SIMULATED): a timing-only simulation: --math computes it\n"
                        "loop: a loop of your own: step(loss=...) logs it")


# ---- deaths in a real run ----------------------------------------------------------------------------------
def _real_death(tmp_path, t0=1.795e9):
    """A real --fault-tolerance run of 3 workers (bound 2): worker 2 is killed in iteration 40, before it
    could log that iteration (a record is written when its iteration ends); the survivors had its iteration-40
    parameters and went on to 42 before the heal at t0 + 42.5."""
    header = dict(mode="decentralized", topology="ring(3)", protocol="tokens", setting="standard",
                  iterations=50, gap_bound=2, message_bytes=8, fault_tolerance=True)
    heal = dict(event="heal", time=t0 + 42.5, failed=[2], survivors=[0, 1], iteration=42, stall_s=0.03)
    for r in range(3):
        last = 39 if r == 2 else 49
        with open(tmp_path / f"rank{r}.jsonl", "w") as f:
            f.write(json.dumps({"rank": r, "run": header}) + "\n")
            for k in range(last + 1):
                f.write(json.dumps(dict(rank=r, iter=k, time=t0 + k, compute_s=0.9, wait_s=0.0)) + "\n")
            if r != 2:
                f.write(json.dumps(heal) + "\n")
    return Run.load(str(tmp_path))


def test_a_dead_worker_counts_in_the_gap_only_while_its_log_says_where_it_was(tmp_path):
    """The report of a real run with a killed rank said "largest gap 3 / 2 EXCEEDED" in red while the run's
    summary said 2: the dead rank's log ends one iteration before it died (the record of the iteration it
    died in is never written), so between its last record and the heal it counted as one iteration behind
    where it was."""
    run = _real_death(tmp_path)
    _, gaps = run.gap_over_time()
    assert gaps.max() <= 2 and run.gap_matrix().max() <= 2
    assert "EXCEEDED" not in page([run])


def test_a_heal_is_shown_at_its_time_into_the_run(tmp_path):
    """The failures list said "healed the graph at 1.795e+09 s": a real run's heal time is seconds since the
    epoch, shown as such."""
    html = page([_real_death(tmp_path)])
    assert "healed the graph at 42.5 s" in html and "e+09" not in html


# ---- live progress -----------------------------------------------------------------------------------------
def test_progress_of_workers_in_step_names_no_straggler():
    """An all-reduce run (every worker in the same iteration) printed "iter 61..61 of 150 (slowest rank 0,
    fastest rank 0)": rank 0 named as the straggler of a run with none."""
    from hopdec.observe.progress import ProgressBoard
    b = ProgressBoard([0, 1, 2], iterations=150, dt=1.0, bound=1)
    for w in range(3):
        b.add(w, 1, 1, 61, 62, 0.5)
    (line,) = b.lines(1)
    assert "iter 61 of 150 (every worker)" in line and "slowest" not in line and "gap 0 (bound 1)" in line


def test_a_local_steps_runs_figures_count_rounds(tmp_path):
    """With --local-steps 4 the timeline's axis said "iteration" for what are rounds of 4 inner steps (the
    summary says "the iterations above are rounds")."""
    from hopdec.report import plots
    simulate(tmp_path, "--topology", "ring", "-n", 4, "--iterations", 20, "--local-steps", 4)
    run = Run.load(str(tmp_path))
    plt = plots.matplotlib()
    fig, (a, b) = plt.subplots(1, 2)
    plots.timeline(a, run)
    plots.gap(b, run)
    assert a.get_ylabel() == "round (4 local steps each)" and "rounds" in b.get_ylabel()
    plt.close(fig)
    # the glance table's rate: rounds, and the mini-batches beside (it read "2.5" as if iterations)
    from hopdec.report.html import glance_rows
    assert glance_rows([run])[0][3:6] == ["5 rounds of 4", "2 virtual s", "2.5 rounds/s (10 mini-batches/s)"]


def test_loss_against_iterations_puts_local_steps_rounds_on_the_mini_batch_axis(tmp_path):
    """The report's "loss against iterations" drew a --local-steps 4 run's rounds at 0..9 beside a plain run's
    mini-batches 0..39: the local run looked 4x faster per gradient computed. A round's mean loss now sits
    at its middle inner step, both runs span the same mini-batches, and the axis says so."""
    from hopdec.report import plots
    argv = ["--topology", "ring", "-n", 4, "--iterations", 40, "--math", "--model", "mlp"]
    simulate(tmp_path / "plain", *argv)
    simulate(tmp_path / "local", *argv, "--local-steps", 4)          # --iterations counts inner steps
    plain, local = (Run.load(str(tmp_path / d)) for d in ("plain", "local"))
    k, y = local.loss_vs_iter()
    assert list(k) == [4 * r + 1.5 for r in range(10)]
    rounds = records(tmp_path / "local", 0)
    assert y[3] == pytest.approx(sum(records(tmp_path / "local", w)[3]["loss"] for w in range(4)) / 4)
    assert rounds[3]["first_step"] == 12 and rounds[3]["inner_steps"] == 4
    kp, _ = plain.loss_vs_iter()
    assert list(kp) == list(range(40))
    assert Run._step_of({"iter": 5, "inner_steps": 2}, 4) == 20.5      # HopOptimizer's short last round
    assert Run._step_of({"iter": 5, "first_step": "x", "inner_steps": -1}, 4) == 21.5   # damaged: H each
    plt = plots.matplotlib()
    fig, (a, b) = plt.subplots(1, 2)
    plots.loss_curves(a, b, [plain, local])
    assert "--local-steps" in b.get_xlabel() and b.get_xlim()[1] < 45
    plt.close(fig)
    fig, (a, b) = plt.subplots(1, 2)
    plots.loss_curves(a, b, [plain])
    assert b.get_xlabel() == "iteration (PS: mini-batches of each worker)"
    # the curves are trailing means, which lag the logged values: the titles say so (they did not)
    assert a.get_title() == "loss against time (trailing mean of 10 iterations; hopdec plot --smooth 1: raw)"
    plt.close(fig)
    fig, (a, b) = plt.subplots(1, 2)
    plots.loss_curves(a, b, [plain], smooth_k=1)
    assert (a.get_title(), b.get_title()) == ("loss against time", "loss against iterations")
    plt.close(fig)


@pytest.mark.parametrize("slow", [None, "rank=1,factor=2"])
def test_a_simulated_all_reduces_summary_gap_is_its_logs(tmp_path, slow):
    """`hopdec sim --mode allreduce` without a straggler printed "largest iteration gap observed: 1" while its
    logs (and its report) said 0: the simulator counted the first worker's start against the others' -1,
    and each worker's step past the instant where all of them took it."""
    from hopdec.report.gaps import largest_gap
    res, text = simulate(tmp_path, "--mode", "allreduce", "-n", 4, "--iterations", 10, "--compute-time", 0.05,
                         *(("--slowdown", slow) if slow else ()))
    run = Run.load(str(tmp_path))
    logged = largest_gap([[(r["time"], r["iter"]) for r in run.records[w]] for w in run.workers])
    assert res["max_gap"] == logged and f"largest iteration gap observed: {logged} " in text


def test_a_run_stopped_early_says_how_far_it_got(tmp_path):
    """A run stopped by Ctrl-C at iteration 635 of 3000 was listed as "3000 iterations, 28.9 s" next to
    runs that finished: the glance table showed the planned iterations, not the ones run."""
    from hopdec.report.html import glance_rows
    run = _real_run(tmp_path / "a")                      # 3 iterations planned, 3 run
    assert glance_rows([run])[0][3] == "3"
    header = json.loads(open(tmp_path / "a" / "rank0.jsonl").readline())["run"]
    run = Run.from_parts({**header, "iterations": 3000}, run.records, run.events, label="stopped")
    assert glance_rows([run])[0][3] == "3 of 3000 (stopped early)"


def test_a_users_loop_shows_the_iterations_it_ran_and_where_its_last_consensus_round_was(tmp_path):
    """A HopOptimizer run plans no iterations (the table said "–") and its last consensus round need not be
    at the end (the column said "at end")."""
    from hopdec.report.html import GLANCE, glance_rows
    run = _real_run(tmp_path / "a")
    header = json.loads(open(tmp_path / "a" / "rank0.jsonl").readline())["run"]
    cons = [dict(event="consensus", at=2, time=0.1, dist_mean=0.25, dist_max=0.5)]
    run = Run.from_parts({**header, "iterations": None}, run.records, {0: cons}, label="mine")
    row = glance_rows([run])[0]
    assert row[3] == "3" and row[GLANCE.index("consensus distance (last round)")] == "0.25 at 2", row


def test_a_dead_ps_worker_leaves_the_gap_and_is_listed(tmp_path):
    """A PS run with a simulated death read "largest gap 32 / 3 EXCEEDED": the report knew deaths only from
    the decentralized runs' heal events, so the dead worker counted to the end; the page listed the death
    only as a server decision "failure: 1 decisions"."""
    simulate(tmp_path, "--mode", "ps", "--sync", "ssp", "-n", 4, "--iterations", 40, "--compute-time", 0.1,
             "--fault-tolerance", "--deaths", "2@1.0")
    run = Run.load(str(tmp_path))
    assert list(run.removed_at()) == [2] and run.removed_at()[2] >= 1.0    # dropped once the server found it
    _, gaps = run.gap_over_time()
    assert gaps.max() <= 3
    html = page([run])
    assert "EXCEEDED" not in html and "worker 2 died at 1 virtual s" in html


def test_a_parameter_server_run_is_labelled_by_its_workers_emulation(tmp_path):
    """A PS run with --slowdown printed 'times: EMULATED -- rank 4 4x slower', but its report said nothing
    of it: the report read rank 0's header, and the server's header has no emulation (its workers' have)."""
    server = dict(mode="ps", sync="ssp", workers=2, worker_ranks=[1, 2], iterations=3, budget=6, gap_bound=3)
    tmp_path.mkdir(parents=True, exist_ok=True)
    for r in range(3):
        head = server if r == 0 else dict(server, worker=r, emulation="rank 2 4x slower")
        with open(tmp_path / f"rank{r}.jsonl", "w") as f:
            f.write(json.dumps({"rank": r, "run": head}) + "\n")
            for k in range(3 if r else 0):
                f.write(json.dumps(dict(rank=r, iter=k, time=100.0 + k, compute_s=0.5, wait_s=0.5)) + "\n")
    run = Run.load(str(tmp_path))
    assert run.conditions() == "EMULATED: rank 2 4x slower"
    glance = page([run])
    assert "EMULATED: rank 2 4x slower" in glance[glance.index("At a glance"):glance.index("Training")]
    res, _ = simulate(tmp_path / "sim", "--mode", "ps", "--sync", "bsp", "-n", 2, "--iterations", 3,
                      "--compute-time", 0.1, "--slowdown", "rank=2,factor=3")
    assert Run.load(str(tmp_path / "sim")).conditions().startswith("compute 0.1 s per iteration; rank 2 3x slower; ")


def _rank_log(path, rank, segments):
    """A rank's log of several runs of one job (a resumed run continues the log after a new header):
    ``segments`` = [(header extras, [(iteration, time), ...], [events])]."""
    with open(path / f"rank{rank}.jsonl", "w") as f:
        for extra, recs, events in segments:
            f.write(json.dumps({"rank": rank, "run": dict(dict(mode="decentralized", iterations=10, run_id="a"),
                                                          **extra)}) + "\n")
            for it, t in recs:
                f.write(json.dumps(dict(rank=rank, iter=it, time=t, compute_s=0.5, wait_s=0.5, loss=1.0)) + "\n")
            for e in events:
                f.write(json.dumps(e) + "\n")


CONS = dict(event="consensus", dist_mean=0.1, dist_max=0.2, dist_rms=0.15, dists=[0.1, 0.2], norm=1.0, argmax=1,
            end=False)


def test_a_resumed_runs_pause_is_left_out_of_its_times(tmp_path):
    """A run checkpointed at iteration 5 and resumed an hour later (raising --iterations to 12): before, the
    report's duration was the hour and its speed a hundredth; now the pause between the checkpoint and the
    restart is left out of every time (records, events, evaluations) and said beside the run."""
    from hopdec.report.html import render
    t0 = 1000.0
    for r in range(2):
        _rank_log(tmp_path, r, [({}, [(k, t0 + k + 0.1 * r) for k in range(5)],
                                 [dict(CONS, at=4, time=t0 + 4.5, t_first=t0 + 4.2)] if r == 0 else []),
                                (dict(resumed_from=5, iterations=12), [(k, t0 + 3600 + k - 5 + 0.1 * r)
                                                                     for k in range(5, 12)],
                                 [dict(CONS, at=8, time=t0 + 3603.5, t_first=t0 + 3603.2)]
                                 if r == 0 else [])])
    with open(tmp_path / "eval.jsonl", "w") as f:
        for t, acc in ((t0 + 4.6, 0.5), (t0 + 3603.6, 0.7)):
            f.write(json.dumps(dict(time=t, test_acc=acc, test_loss=1.0, at=0)) + "\n")
    run = Run.load(str(tmp_path))
    gap = (t0 + 3600) - (t0 + 4.1 + 1.0)        # the first restart, less the checkpoint (the last kept record
    assert run.paused == [("iteration 5", pytest.approx(gap))]           # of any rank + a step)
    times = [x["time"] for x in run.records[1]]
    steps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == t0 + 0.1 and max(steps) < 1.5, steps            # no pause left
    assert [e["time"] for e in run.events_of("consensus")] == pytest.approx([t0 + 4.5, t0 + 3603.5 - gap])
    assert [e["time"] for e in run.evals] == pytest.approx([t0 + 4.6, t0 + 3603.6 - gap])
    assert run.iterations == 12 and run.iterations_run() == 12
    assert any("resumed at iteration 5" in n for n in run.notes)
    page = render([run])
    assert "resumed at iteration 5: the 3594.9 s pause before it is left out of the times" in page
    assert "EMULATED" not in page


def test_a_resumed_parameter_server_runs_pause_is_left_out_too(tmp_path):
    """A PS run's resumed header says the checkpoint cut (``resumed_from_cut``), not an iteration: its pause
    is left out of the workers' records and the server's events alike."""
    t0 = 1000.0
    with open(tmp_path / "rank0.jsonl", "w") as f:         # the server: events only
        for extra, times in (({}, (t0, t0 + 3)), ({"resumed_from_cut": 2}, (t0 + 3600, t0 + 3603))):
            f.write(json.dumps({"rank": 0, "run": dict(dict(mode="ps", sync="bsp", iterations=8, run_id="a"),
                                                       **extra)}) + "\n")
            for t in times:
                f.write(json.dumps(dict(event="eval", time=t, version=0, work=0, test_acc=0.5, test_loss=1.0))
                        + "\n")
    for r in (1, 2):
        _rank_log(tmp_path, r, [({}, [(k, t0 + k) for k in range(4)], []),
                                ({"resumed_from_cut": 2}, [(k, t0 + 3600 + k - 4) for k in range(4, 8)], [])])
    run = Run.load(str(tmp_path))
    gap = 3600 - 3 - 1.0
    assert run.paused == [("checkpoint cut 2", pytest.approx(gap))]
    assert [e["time"] for e in run.events_of("eval")] == pytest.approx([t0, t0 + 3, t0 + 3600 - gap, t0 + 3603 - gap])
    assert max(x["time"] for x in run.records[1]) == pytest.approx(t0 + 3603 - gap)
    assert "resumed at checkpoint cut 2" in run.resumed()


def test_a_resumed_parameter_server_runs_duration_and_push_intervals_leave_the_pause_out(tmp_path):
    """A PS run resumed an hour later: the duration was the summary's elapsed -- the resumed process's
    alone -- while the rate counted both; and the push interval averaged the hour in (a worker's ``t_push``
    was not shifted with its ``time``)."""
    t0 = 1000.0
    with open(tmp_path / "rank0.jsonl", "w") as f:
        for extra, times in (({}, (t0,)), ({"resumed_from_cut": 2}, (t0 + 3600, t0 + 3604))):
            f.write(json.dumps({"rank": 0, "run": dict(dict(mode="ps", sync="asp", iterations=8, run_id="a"),
                                                       **extra)}) + "\n")
            for t in times:
                f.write(json.dumps(dict(event="release", time=t, workers=[1], version=0, gaps=[0])) + "\n")
        f.write(json.dumps(dict(event="summary", elapsed=4.0, version=8, applied=8, dropped=0, work=8)) + "\n")
    with open(tmp_path / "rank1.jsonl", "w") as f:
        for extra, ks, base in (({}, range(4), t0), ({"resumed_from_cut": 2}, range(4, 8), t0 + 3600 - 4)):
            f.write(json.dumps({"rank": 1, "run": dict(dict(mode="ps", iterations=8, run_id="a"), **extra)}) + "\n")
            for k in ks:
                f.write(json.dumps(dict(rank=1, iter=k, time=base + k, t_recv=base + k, t_push=base + k + 0.5,
                                        compute_s=0.5, wait_s=0.5, loss=1.0, staleness=0)) + "\n")
    run = Run.load(str(tmp_path))
    assert run.paused and run.paused[0][1] > 3500
    assert run.counters()[1]["push_interval_s"] == pytest.approx(1.0)
    final = run.final()
    assert final["duration"] == pytest.approx(8.0) and final["rate"] == pytest.approx(1.0)


def test_the_gap_over_time_reads_the_runs_start_once_not_once_per_point(tmp_path, monkeypatch):
    """``hopdec report`` of a 16-worker PS run of 300 iterations took 20 s: the gap curve subtracted the run's
    start from each of its ~3,000 points, and the start (``Run.t0``) scans every worker's first record and
    all the server's events each time it is read."""
    simulate(tmp_path, "--mode", "ps", "--sync", "ssp", "-n", 6, "--iterations", 20)
    run = Run.load(str(tmp_path))
    reads = []
    start = Run.t0.fget
    monkeypatch.setattr(Run, "t0", property(lambda self: reads.append(1) or start(self)))
    t, gaps = run.gap_over_time()
    assert len(t) == len(gaps) > 10 and t.min() >= 0
    assert len(reads) == 1


def _every_pair_at_every_instant(entries, gone=None):
    """The gap matrix as the definition says it: after each instant, every live pair (what
    :func:`hopdec.report.gaps.max_iteration_gap` did until it updated only the pairs of the workers that moved)."""
    import numpy as np
    from hopdec.report.gaps import _events
    n, events = len(entries), _events(entries, gone)
    cur, alive, best = np.full(n, -1), np.ones(n, dtype=bool), np.zeros((n, n), dtype=np.int64)
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            _, r, k = events[i]
            if k is None:
                alive[r] = False
            elif alive[r]:
                cur[r] = max(cur[r], k)
            i += 1
        if (cur[alive] >= 0).all():
            live = np.flatnonzero(alive & (cur >= 0))
            sub = cur[live]
            best[np.ix_(live, live)] = np.maximum(best[np.ix_(live, live)], sub[:, None] - sub[None, :])
    return best


def test_the_gap_matrix_is_every_pairs_largest_gap_at_every_instant():
    """The report of 64 workers x 500 iterations spent 4 of its 9 s in the gap matrix (every pair at every
    instant); now only the pairs of the workers that moved -- on random runs with ties, late starters,
    deaths (also of a worker that never started) and repeated iterations, the same matrix."""
    import random
    import numpy as np
    from hopdec.report.gaps import max_iteration_gap
    for seed in range(300):
        r = random.Random(seed)
        n = r.randint(1, 7)
        entries = []
        for _ in range(n):
            t, k, ev = r.choice([0, 1, 5]), r.randint(0, 2), []
            for _ in range(r.randint(0, 12)):
                ev.append((t, k))
                t += r.choice([0, 1, 1, 2, 3])
                k += r.choice([0, 1, 1, 2])
            entries.append(ev)
        gone = [r.choice([None, None, r.randint(0, 20)]) for _ in range(n)] if r.random() < 0.5 else None
        assert np.array_equal(max_iteration_gap(entries, gone), _every_pair_at_every_instant(entries, gone)), seed


def test_the_time_breakdown_of_many_workers_draws_groups_of_ranks(tmp_path):
    """The breakdown of 1,024 workers drew 1,024 bars and labels (a black smear, 15 s); above 32 workers
    each bar is a group of consecutive ranks, its parts their mean, labelled with the ranks; 32 or fewer,
    one bar per worker."""
    import numpy as np
    from hopdec.report import plots
    plt = plots.matplotlib()
    for n, bars, first, title in [(70, 24, "ranks 0-2", "mean of each 3 ranks"), (8, 8, "rank 0", "each worker")]:
        d = tmp_path / str(n)
        simulate(d, "--topology", "ring", "-n", n, "--iterations", 6, "--slowdown", "rank=4,factor=3")
        run = Run.load(str(d))
        fig, ax = plt.subplots()
        plots.breakdown(ax, run)
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert len(labels) == bars and labels[0] == first and title in ax.get_title()
        b = run.breakdown()
        size = -(-n // bars)
        compute = [p for p in ax.patches if p.get_facecolor()[:3] == plt.matplotlib.colors.to_rgb(
            plots.PART_COLORS["compute"])]
        assert len(compute) == bars
        want = np.mean([b[w]["compute"] for w in range(size)])      # the group with the slow rank 4 in it
        assert compute[4 // size].get_width() == pytest.approx(np.mean([b[w]["compute"] for w in range(
            (4 // size) * size, (4 // size + 1) * size)]))
        assert compute[0].get_width() == pytest.approx(want)
        plt.close(fig)


def test_the_counters_of_a_large_run_show_its_straggler(tmp_path):
    """The counters of more than 24 workers showed the first and last 12, so a straggler in the middle (rank
    20 of 40, 4x slower, jumping) was never in the table; now each column's extremes are too."""
    import re
    simulate(tmp_path, "--topology", "ring-based", "-n", 40, "--iterations", 30, "--slowdown", "rank=20,factor=4",
             "--backup-workers", 1, "--skip", "max-jump=2,trigger=1")
    html = page([Run.load(str(tmp_path))])
    counters = html[html.index("Mechanism counters"):html.index("Settings of this run")]
    shown = [int(r) for r in re.findall(r"<td>rank (\d+)</td>", counters)]
    assert shown[:12] == list(range(12)) and shown[-12:] == list(range(28, 40)) and 20 in shown
    jumps = {int(w): int(j) for w, j in re.findall(r"<td>rank (\d+)</td><td>\d+</td><td>(\d+)</td>", counters)}
    assert jumps[20] == max(jumps.values()) > 0
    assert counters.count("<td>…</td>") % 10 == 0 and counters.count("<td>…</td>") >= 10    # a gap before 20
    assert f"{len(shown)} of 40 workers" in counters


# ---- a run's logs gathered only in part ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", [[], ["--mode", "ps", "--sync", "ssp"], ["--mode", "allreduce"]])
def test_a_directory_without_some_of_the_runs_ranks_says_so(tmp_path, mode):
    """A run across hosts writes each host's ranks' logs on that host; a directory gathered from some of the hosts
    was reported as a smaller run ("3 workers") without a word. The headers say how many ranks the run had
    (``workers``; a parameter server's ``worker_ranks``), so the report names the ranks it lacks."""
    simulate(tmp_path, "-n", 6, "--iterations", 4, *mode)
    assert Run.load(str(tmp_path)).missing is None
    ranks = 7 if mode and mode[1] == "ps" else 6
    (tmp_path / "rank2.jsonl").unlink()
    (tmp_path / "rank4.jsonl").write_text("")
    run = Run.load(str(tmp_path))
    assert run.missing.startswith(f"logs of {ranks - 2} of the run's {ranks} ranks: rank2.jsonl, rank4.jsonl missing "
                                  "or empty"), run.missing
    assert [n for n in run.notes if "missing or empty" in n] == [f"{tmp_path}: {run.missing}"]
    import html
    assert html.escape(f"Logs of {ranks - 2} of the run's {ranks} ranks: rank2.jsonl") in page([run])
    (tmp_path / "rank0.jsonl").unlink()             # the server's (PS) or rank 0's: the workers' headers say it
    assert Run.load(str(tmp_path)).missing.startswith(f"logs of {ranks - 3} of the run's {ranks} ranks: rank0.jsonl, "
                                                      "rank2.jsonl, rank4.jsonl")


def test_the_users_loop_logs_say_how_many_ranks_ran():
    """HopOptimizer's header (a user's own loop) carries the rank count as hopdec train's does."""
    import networkx as nx
    from hopdec.optim.assembly import header
    from hopdec.hop.config import ProtocolConfig
    g = nx.cycle_graph(5, create_using=nx.DiGraph)
    assert header(g, ProtocolConfig(iterations=10), None, 10, "cpu", 10, 2, False, {})["workers"] == 5


def test_a_hostile_rank_count_is_answered_at_once():
    """``missing_ranks`` steps over the logged ranks and the few it names, never the header's whole count."""
    from hopdec.report.data import missing_ranks
    assert missing_ranks(range(2 ** 52), {0, 1, 3}) == (2 ** 52 - 3, [2, 4, 5, 6, 7, 8, 9, 10])
    assert missing_ranks({0, 1, 2}, {0, 1, 2, 7}) == (0, [])
    assert missing_ranks(None, {0}) == (0, [])


def test_a_local_steps_runs_mini_batches_per_second_leave_out_the_rounds_a_jump_passed(tmp_path):
    """The glance table's mini-batches/s was H x the rounds/s, and a straggler's rounds/s counts the rounds
    its jumps (--skip) passed without computing them: 4.08 mini-batches/s shown where the workers computed
    3.48. Now each worker's rounds computed between its first and last round's start, at their inner steps."""
    simulate(tmp_path, "--topology", "complete", "-n", 3, "--iterations", 40, "--local-steps", 2, "--staleness", 1,
             "--skip", "max-jump=2,trigger=2", "--slowdown", "rank=2,factor=5")
    run = Run.load(str(tmp_path))
    recs = [records(tmp_path, w) for w in range(3)]
    assert any("jumped_from" in r for r in recs[2])
    computed = np.mean([sum(r["inner_steps"] for r in rs[:-1]) / (rs[-1]["time"] - rs[0]["time"]) for rs in recs])
    rounds = np.mean([(rs[-1]["iter"] - rs[0]["iter"]) / (rs[-1]["time"] - rs[0]["time"]) for rs in recs])
    assert computed < 0.9 * 2 * rounds                    # the jumps' rounds are a sixth of the straggler's
    from hopdec.report.html import _fmt, glance_rows
    assert glance_rows([run])[0][5] == f"{_fmt(rounds)} rounds/s ({_fmt(computed)} mini-batches/s)"
    # a loop of your own (HopOptimizer): a rank that finished its steps first serves rounds without a
    # gradient (inner_steps 0, "serving"): 2 rounds of 2 in 4 s, not 4 rounds' worth
    recs = [dict(iter=k, time=float(k), inner_steps=n, **({"serving": True} if s else {}))
            for k, (n, s) in enumerate([(2, 0), (2, 0), (0, 0), (0, 1), (0, 1)])]
    mine = Run.from_parts({"mode": "decentralized", "local_steps": 2, "iterations": None}, {0: recs}, {0: []})
    assert glance_rows([mine])[0][5] == "1 rounds/s (1 mini-batches/s)"
