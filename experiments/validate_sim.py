"""The simulator against real runs on the default code path: on this host, or on emulated links.

    python3 experiments/validate_sim.py [--where local|netns] [--random N] [--seed S] [--no-fixed]
                                        [--iterations 60] [--latency SECONDS] [--out DIR] [--report-only]

Cases (:mod:`hopdec.testbed.validate`, 8 MPI ranks, mlp on digits, compute padded to 0.05 s): the
hand-picked ones (:func:`~hopdec.testbed.validate.fixed`: ring-based with a random 6x slowdown and backup
workers / staleness; the audit's torus 2x4 with a 4x straggler and skipping; a PS with a straggler) and
``--random N`` contexts drawn with ``--seed`` from :data:`~hopdec.testbed.validate.SPACE` (graph, max_ig,
slowdown, mechanism; a quarter parameter servers), each a baseline and one variant.

``--where local``: every real run in ONE ``mpirun -n 8`` job on this host (shared memory between ranks);
the simulator with Open MPI's shared-memory eager limit (4096 B), rendezvous ``take``. ``--where
netns``: every context on an emulated network of its own (:mod:`hopdec.testbed`: one namespace per rank,
NICs, link capacities, delays and the TCP eager limit drawn from :data:`~hopdec.testbed.validate.NET_SPACE`,
measured before the runs), launched through ``launch/hostfile.sh``; the simulator with the same NICs,
links and delays (plus ``--latency`` as the base latency), rendezvous ``push`` (TCP). Real runs take the
default code path: zero-copy sends, nothing patched.

Prints, per case, real and simulated iterations/s (median over workers) and the error, the largest
iteration gap of both, the mean wait for sends to complete per iteration (``wait_sends_s``), and per
variant the throughput ratio to its baseline, real and simulated, with the error; then a summary. Writes
everything to ``DIR/rows.json``.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hopdec.testbed import validate as V  # noqa: E402
from hopdec.sim.sends import DEFAULT_EAGER_BYTES, SHARED_MEMORY_EAGER_BYTES  # noqa: E402
from hopdec.testbed.spec import from_json  # noqa: E402

DEFAULT_LATENCY = 5e-5


def write_runs(out, name, cases, iterations):
    runs = [V.train_argv(c, iterations, os.path.join(out, f"real_{c.name}")) for c in cases]
    path = os.path.join(out, f"runs_{name}.json")
    with open(path, "w") as f:
        json.dump(runs, f)
    return path


def driver(out):
    path = os.path.join(out, "driver.py")
    with open(path, "w") as f:
        f.write(V.DRIVER)
    return path


def run_local(out, cases, iterations, timeout):
    """Every case in one ``mpirun -n 8`` job on this host."""
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(V.RANKS), sys.executable, driver(out),
           write_runs(out, "local", cases, iterations)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        sys.exit(f"mpirun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def contexts(cases):
    """Cases grouped by context: each baseline with its variants."""
    groups = {}
    for c in cases:
        groups.setdefault(c.base or c.name, []).append(c)
    return list(groups.values())


def run_netns(out, cases, iterations, timeout, seed, latency):
    """Every context on an emulated network of its own; returns {case: sim kwargs} and the networks."""
    from hopdec.testbed.netns import NetnsTestbed, support
    why = support()
    if why:
        sys.exit(f"--where netns: {why}")
    rng = random.Random(seed * 7919 + 1)
    sim_kw, nets = {}, {}
    drv = driver(out)
    for group in contexts(cases):
        spec, eager = V.sample_network(rng, group[0])
        key = group[0].name
        runs = write_runs(out, key, group, iterations)
        extra = "" if eager is None else f"--mca btl_tcp_eager_limit {eager} --mca btl_tcp_rndv_eager_limit {eager}"
        t0 = time.time()
        with NetnsTestbed(spec) as tb:
            tb.measure(pairs=[(0, 1)], rtt_count=10, bulk_s=1.0)
            proc = tb.run(V.RANKS, cmd=f"{sys.executable} {drv} {runs}", timeout=timeout,
                          env=dict(os.environ, HOPDEC_MPIRUN_ARGS=extra))
            cond = tb.conditions()
        if proc.returncode:
            sys.exit(f"testbed run of {key} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        m = cond["measured"][0]
        nets[key] = dict(conditions=cond, eager=eager or DEFAULT_EAGER_BYTES, wall_s=time.time() - t0,
                         spec=spec.to_json())
        print(f"{key}: {describe_net(spec, eager)}; measured r0->r1 {m['mbit']:.1f} Mbit/s, RTT median "
              f"{m['rtt_ms_median']:.2f} ms ({time.time() - t0:.0f} s)", flush=True)
        for c in group:
            sim_kw[c.name] = dict(V.sim_network(c, spec, out, latency), eager=eager or DEFAULT_EAGER_BYTES,
                                  rendezvous="push")
    return sim_kw, nets


def describe_net(spec, eager):
    nics = sorted({h.nic_mbit for h in spec.hosts}, key=lambda x: (x is None, x or 0))
    links = sorted({(lk.mbit, lk.delay_ms) for lk in spec.links.values()}, key=lambda x: (x[0] is None, x[0] or 0))
    f = lambda x: "-" if x is None else f"{x:g}"  # noqa: E731
    return (f"NICs {'/'.join(f(x) for x in nics)} Mbit/s, links "
            f"{', '.join(f'{f(m)} Mbit/s +{d:g} ms' for m, d in links) or 'NICs only'}, TCP eager "
            f"{eager or DEFAULT_EAGER_BYTES} B")



OUT_MARK = ".hopdec_validate"
"""The file that says a folder is this script's output (:func:`fresh_out` empties only such folders)."""


def fresh_out(out):
    """Make ``out`` an empty folder of this script's for a fresh run: a new folder, an empty one, or an
    earlier run's (it holds :data:`OUT_MARK`), emptied. ValueError for a folder with files this script did
    not write (``--out .`` would otherwise have emptied the current folder)."""
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, OUT_MARK)):
        raise ValueError(f"--out {out}: the folder holds files this script did not write; give a new or "
                         f"empty folder (a fresh run empties it)")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out}: not a folder")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    with open(os.path.join(out, OUT_MARK), "w") as f:
        f.write("experiments/validate_sim.py output: a fresh run empties this folder\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--where", choices=("local", "netns"), default="local")
    ap.add_argument("--random", type=int, default=12, help="random contexts (default 12)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random contexts (and networks)")
    ap.add_argument("--no-fixed", action="store_true", help="only the random contexts")
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--latency", type=float, default=DEFAULT_LATENCY,
                    help="the simulator's --latency (netns: the base, delays are added); default 50 us")
    ap.add_argument("--out", default="/tmp/hopdec_validate")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--report-only", action="store_true", help="re-read the logs in --out, simulate again")
    ap.add_argument("--markdown", action="store_true", help="also print the tables as markdown")
    ap.add_argument("--measured-delay", action="store_true",
                    help="netns: simulate each link's delay as measured (half the median round trip before "
                         "the runs) instead of as configured (the forwarder is late under heavy load)")
    args = ap.parse_args(argv)

    if not args.report_only:
        try:
            fresh_out(args.out)
        except ValueError as err:
            ap.error(str(err))
    os.makedirs(args.out, exist_ok=True)
    cases = ([] if args.no_fixed else V.fixed(os.path.join(ROOT, "topologies"))) + \
        V.sample(args.seed, args.random, topo_dir=os.path.join(ROOT, "topologies"), work_dir=args.out)
    t0 = time.time()
    nets = {}
    if args.where == "local":
        def kw_at(c, lat):
            return dict(latency=lat, eager=SHARED_MEMORY_EAGER_BYTES, rendezvous="take")
        sim_kw = {c.name: kw_at(c, args.latency) for c in cases}
        if not args.report_only:
            run_local(args.out, cases, args.iterations, args.timeout)
    else:
        if args.report_only:
            with open(os.path.join(args.out, "netns.json")) as f:
                saved = json.load(f)
            sim_kw, nets = saved["sim_kw"], saved["nets"]
        else:
            sim_kw, nets = run_netns(args.out, cases, args.iterations, args.timeout, args.seed, args.latency)
            with open(os.path.join(args.out, "netns.json"), "w") as f:
                json.dump(dict(sim_kw=sim_kw, nets=nets), f)

        def kw_at(c, lat):
            key = (c.base or c.name)
            spec = from_json(nets[key]["spec"])
            rtt = nets[key]["conditions"]["measured"][0]["rtt_ms_median"] / 1e3
            return dict(V.sim_network(c, spec, args.out, lat, delay_s=rtt / 2 if args.measured_delay else None),
                        eager=nets[key]["eager"], rendezvous="push")
        sim_kw = {c.name: kw_at(c, args.latency) for c in cases}
    if not args.report_only:
        print(f"real runs: {len(cases)} in {time.time() - t0:.0f} s", flush=True)
    real = {c.name: V.metrics(os.path.join(args.out, f"real_{c.name}")) for c in cases}
    sim = {c.name: V.simulate_case(c, args.iterations, os.path.join(args.out, f"sim_{c.name}"), **sim_kw[c.name])
           for c in cases}
    rows = V.compare(cases, real, sim)
    calibrate(rows, cases, real, kw_at, args)
    report(rows, args)
    if args.markdown:
        markdown(rows, cases, nets)
    with open(os.path.join(args.out, "rows.json"), "w") as f:
        json.dump(dict(rows=rows, where=args.where, seed=args.seed, iterations=args.iterations,
                       latency=args.latency, nets=nets), f, indent=1)


def calibrate(rows, cases, real, kw_at, args):
    """PS variants once more, with the simulator's base latency fitted on their BSP baseline's real rate
    (:func:`hopdec.testbed.validate.fit_latency`): ``cal_latency``, ``sim_ratio_cal``, ``ratio_err_cal``.
    ``kw_at(case, latency)``: the case's simulator options at that base latency. (Only PS: a BSP step
    has two messages on its path, so the latency is what makes it longer; a decentralized worker's
    messages are mostly off its path -- fitting a latency there would absorb anything.)"""
    by = {c.name: c for c in cases}
    fitted = {}
    for row in rows:
        c = by[row["case"]]
        if c.base is None or "ratio_err" not in row or not c.ps:
            continue
        b = by[c.base]
        out = lambda c, tag: os.path.join(args.out, f"simcal_{tag}_{c.name}")  # noqa: E731
        if b.name not in fitted:
            fitted[b.name] = V.fit_latency(
                lambda lat: V.simulate_case(b, args.iterations, out(b, "fit"), **kw_at(b, lat))["rate"],
                real[b.name]["rate"])
        lat = fitted[b.name]
        s = V.simulate_case(c, args.iterations, out(c, "var"), **kw_at(c, lat))
        sb = V.simulate_case(b, args.iterations, out(b, "var"), **kw_at(b, lat))
        row.update(cal_latency=lat, sim_ratio_cal=s["rate"] / sb["rate"],
                   ratio_err_cal=s["rate"] / sb["rate"] / row["real_ratio"] - 1)


def markdown(rows, cases, nets):
    """The tables of experiments/README.md: one row per variant (with its baseline's figures)."""
    by = {r["case"]: r for r in rows}
    print("\n| context | network (netns) | baseline | variant | real it/s base / variant | simulated | ratio real | "
          "simulated | error | gaps real / sim | wait sends ms real / sim |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in cases:
        if c.base is None or c.name not in by or c.base not in by:
            continue
        r, b = by[c.name], by[c.base]
        net = nets.get(c.base, {})
        desc = "-"
        if net:
            from hopdec.testbed.spec import from_json as fj
            desc = describe_net(fj(net["spec"]), net["eager"])
        err = f"{r['ratio_err']:+.1%}" + (f" (fitted latency: {r['ratio_err_cal']:+.1%})" if "ratio_err_cal" in r else "")
        k = 0
        while k < min(len(c.argv), len(b["argv"])) and c.argv[k] == b["argv"][k]:
            k += 1
        while k > 0 and not c.argv[k - 1 if k < len(c.argv) and not c.argv[k].startswith("--") else k].startswith("--"):
            k -= 1
        variant = " ".join(c.argv[k:]) or c.name
        if k and not variant.startswith("--"):
            variant = f"{c.argv[k - 1]} {variant}"
        print(f"| {label(r)} | {desc} | {c.base} | `{variant}` | {b['real_rate']:.2f} / {r['real_rate']:.2f} | "
              f"{b['sim_rate']:.2f} / {r['sim_rate']:.2f} | {r['real_ratio']:.3f} | {r['sim_ratio']:.3f} | {err} | "
              f"{b['real_gap']}/{b['sim_gap']}, {r['real_gap']}/{r['sim_gap']} | "
              f"{r['real_wait_sends_s'] * 1e3:.1f} / {r['sim_wait_sends_s'] * 1e3:.1f} |")


def label(row):
    c = row["context"]
    if not c:
        return "hand-picked"
    if c["kind"] == "ps":
        return f"PS, {c['slowdown']}"
    return f"{c['graph']}, max_ig {c['max_ig']}, {c['slowdown']}"


def report(rows, args):
    print(f"\n{'case':>28}  {'context':<46} {'real it/s':>9} {'sim':>7} {'err':>7}  {'gap r/s':>7}  "
          f"{'wait sends ms r/s':>17}  {'ratio real':>10} {'sim':>6} {'err':>7}")
    for r in rows:
        ratio = (f"{r['real_ratio']:>10.3f} {r['sim_ratio']:>6.3f} {r['ratio_err']:>+7.1%}" if "ratio_err" in r else "")
        print(f"{r['case']:>28}  {label(r):<46} {r['real_rate']:>9.3f} {r['sim_rate']:>7.3f} {r['rate_err']:>+7.1%}  "
              f"{r['real_gap']:>3}/{r['sim_gap']:<3}  {r['real_wait_sends_s'] * 1e3:>8.1f}/{r['sim_wait_sends_s'] * 1e3:<8.1f}"
              f"  {ratio}")
    cal = [r for r in rows if "ratio_err_cal" in r]
    if cal:
        print("\nPS variants again, the simulator's base latency fitted on their BSP baseline's real rate:")
        for r in cal:
            print(f"{r['case']:>28}  latency {r['cal_latency'] * 1e3:5.2f} ms: ratio real {r['real_ratio']:.3f}, "
                  f"simulated {r['sim_ratio_cal']:.3f} ({r['ratio_err_cal']:+.1%}; uncalibrated {r['ratio_err']:+.1%})")
        errs = [abs(r["ratio_err_cal"]) for r in cal]
        print(f"calibrated |ratio error| median {statistics.median(errs):.1%}, largest {max(errs):.1%}")
    ratio_errs = [abs(r["ratio_err"]) for r in rows if "ratio_err" in r]
    rate_errs = [abs(r["rate_err"]) for r in rows]
    gaps = [abs(r["real_gap"] - r["sim_gap"]) for r in rows]
    print(f"\n{args.where}: {len(rows)} cases, {len(ratio_errs)} ratios; |ratio error| median "
          f"{statistics.median(ratio_errs):.1%}, largest {max(ratio_errs):.1%}; |rate error| median "
          f"{statistics.median(rate_errs):.1%}, largest {max(rate_errs):.1%}; |gap difference| largest "
          f"{max(gaps)}; simulator latency {args.latency:g} s")


if __name__ == "__main__":
    main()
