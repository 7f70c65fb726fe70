"""The simulator's results pinned bit for bit: speeding it up must not change what it simulates.

Each case is a small ``hopdec sim`` run chosen to reach a different path of the cost model and the
drivers: transfers that share NICs (contention, the general rule and its re-rating), links and NICs of
their own from a topology file, half duplex, stragglers with backup workers and skipping, bounded
staleness, notify-ack, the serial graph, update queues only, every parameter-server sync model through
the server's hub NIC, the send model's paths (:mod:`hopdec.sim.sends`: zero-copy with take and push
rendezvous, copy, eager), compressed exchanges (coded sizes), local steps, time-varying topologies and
simulated deaths healed. The golden values were recorded from main's simulator (commit 2da2bc8: the
send model, coded streams, local steps and simulated deaths, without this branch's speed-ups): every
log record's virtual times and protocol fields (hashed), the virtual time, the largest gap, and the
numbers of events, data messages and control messages.

A deliberate change of the cost model changes them: re-record with
``python tests/test_sim_golden.py --record`` and say why in the commit.

Re-recorded (issue 21, the pool of send stores): exponential-backup-push, exponential-backup-zero-copy,
exponential-churn-push, exponential-free-network, exponential-straggler-backup-skip, one-peer-exponential,
torus-hybrid-half-duplex and torus-shm-take-staleness -- exactly the cases in which some worker's Reduce
waited for its sends with two stores (``wait_sends_s`` > 0 in the old logs); with the pool it writes a
new store there instead. Every case without such a wait is unchanged bit for bit.

Re-recorded (a push answered with a stop is not work): ps-asp-deaths, ps-asp-fast-server, ps-backup,
ps-dssp, ps-elastic and ps-ssp -- only the server's ``work`` field changed (the hash without it is the same).

Re-recorded (skipping alone refused where it never jumps): one-peer-exponential-topk-skip had skipping
without backup workers or staleness on a schedule that sends at every step (0 jumps); it is now
one-peer-exponential-topk-staleness-skip, with ``--staleness 1``.
"""

import hashlib
import io
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hopdec.cli.sim import parse  # noqa: E402
from hopdec.sim.run import simulate  # noqa: E402

CONTENDED = ["--message-mb", "4", "--bandwidth", "1", "--compute-time", "normal:mean=0.03,std=0.01"]
STRAGGLING = ["--topology", "exponential", "-n", "16", "--iterations", "30", "--slowdown", "random:factor=4,prob=1/n",
              "--backup-workers", "1"]
CASES = {
    "ring-based-contended": ["--topology", "ring-based", "-n", "16", "--iterations", "30", *CONTENDED],
    "exponential-straggler-backup-skip": [
        "--topology", "exponential", "-n", "16", "--iterations", "40", "--latency", "0.001",
        "--slowdown", "random:factor=6,prob=1/n", "--backup-workers", "1", "--skip", "max-jump=4,trigger=2",
        "--compute-time", "normal:mean=0.1,std=0.02", "--message-mb", "2"],
    "torus-hybrid-half-duplex": [
        "--topology", "torus", "-n", "16", "--iterations", "30", "--staleness", "2", "--backup-workers", "1",
        "--nic-duplex", "half", "--slowdown", "rank=5,factor=3", *CONTENDED],
    "ring-notify-ack-serial": [
        "--topology", "ring", "-n", "8", "--iterations", "30", "--protocol", "notify-ack",
        "--compute-graph", "serial", *CONTENDED],
    "double-ring-queue-only": [
        "--topology", "double-ring", "-n", "16", "--iterations", "30", "--protocol", "queue-only",
        "--bandwidth", "3@0.2", "--latency", "0", *CONTENDED],
    "links-from-file": None,            # filled in by _links_file
    "ring-based-mixed-no-latency": ["--topology", "ring-based", "-n", "16", "--iterations", "30", "--message-mb",
                                    "1", "--bandwidth", "2", "--latency", "0", "--compute-time",
                                    "normal:mean=0.03,std=0.01", "--slowdown", "rank=3,factor=2"],
    "exponential-free-network": ["--topology", "exponential", "-n", "32", "--iterations", "20", "--bandwidth", "inf",
                                 "--compute-time", "uniform:low=0.05,high=0.15"],
    "ring-based-128": ["--topology", "ring-based", "-n", "128", "--iterations", "12",
                       "--compute-time", "normal:mean=0.25,std=0.02"],
    "ps-bsp": ["--mode", "ps", "--sync", "bsp", "-n", "12", "--iterations", "15", *CONTENDED],
    "ps-asp-fast-server": ["--mode", "ps", "--sync", "asp", "-n", "12", "--iterations", "15",
                           "--bandwidth", "0@4", *CONTENDED],
    "ps-ssp": ["--mode", "ps", "--sync", "ssp", "-n", "8", "--iterations", "15", "--slowdown", "rank=2,factor=4",
               *CONTENDED],
    "ps-dssp": ["--mode", "ps", "--sync", "dssp", "-n", "8", "--iterations", "15", *CONTENDED],
    "ps-elastic": ["--mode", "ps", "--sync", "elastic", "-n", "8", "--iterations", "15", *CONTENDED],
    "ps-backup": ["--mode", "ps", "--sync", "backup", "-n", "8", "--iterations", "15", "--latency", "0.002",
                  *CONTENDED],
    "ps-esync-half-duplex": ["--mode", "ps", "--sync", "esync", "-n", "8", "--iterations", "15",
                             "--nic-duplex", "half", *CONTENDED],
    # the send model (hopdec.sim.sends): every case above takes its default (zero-copy, TCP's eager limit,
    # take); these reach the other paths
    "exponential-backup-zero-copy": [*STRAGGLING, *CONTENDED],
    "exponential-backup-copy-path": [*STRAGGLING, "--send-path", "copy", *CONTENDED],
    "exponential-backup-push": [*STRAGGLING, "--rendezvous", "push", *CONTENDED],
    "ring-based-small-eager": ["--topology", "ring-based", "-n", "16", "--iterations", "30", "--message-mb", "0.03",
                               "--bandwidth", "0.01", "--compute-time", "normal:mean=0.03,std=0.01"],
    "torus-shm-take-staleness": ["--topology", "torus", "-n", "16", "--iterations", "30", "--eager-limit", "4096",
                                 "--staleness", "2", "--slowdown", "rank=5,factor=3", *CONTENDED],
    # compressed exchanges (each message its coded size) and time-varying topologies
    "ring-based-int8": ["--topology", "ring-based", "-n", "16", "--iterations", "30", "--compress", "int8",
                        *CONTENDED],
    "one-peer-exponential": ["--topology", "one-peer-exponential", "-n", "16", "--iterations", "40",
                             "--slowdown", "random:factor=4,prob=1/n", *CONTENDED],
    "one-peer-exponential-topk-staleness-skip": [
        "--topology", "one-peer-exponential", "-n", "16", "--iterations", "40", "--compress", "topk:0.05",
        "--staleness", "1", "--skip", "max-jump=2,trigger=2", "--slowdown", "rank=2,factor=5", *CONTENDED],
    "ring-based-local-steps-int8": ["--topology", "ring-based", "-n", "16", "--iterations", "40", "--local-steps", "4",
                                    "--compress", "int8", "--slowdown", "rank=3,factor=2", *CONTENDED],
    # simulated deaths healed through the heal code (hopdec.sim.churn): the network behind its gate
    "ring-based-deaths-healed": ["--topology", "ring-based", "-n", "16", "--iterations", "30", "--fault-tolerance",
                                 "--deaths", "3@0.4,9@0.41,12@1.2", *CONTENDED],
    "exponential-churn-push": ["--topology", "exponential", "-n", "32", "--iterations", "30", "--fault-tolerance",
                               "--churn-mttf", "40", "--seed", "2", "--rendezvous", "push", "--backup-workers", "1",
                               *CONTENDED],
    "ps-asp-deaths": ["--mode", "ps", "--sync", "asp", "-n", "8", "--iterations", "15", "--fault-tolerance",
                      "--deaths", "2@0.3,5@0.6", *CONTENDED],
    # a BSP barrier waits for a dead worker until the server finds it (--failure-detection)
    "ps-bsp-deaths-detected": ["--mode", "ps", "--sync", "bsp", "-n", "8", "--iterations", "15", "--fault-tolerance",
                               "--deaths", "3@0.5,6@0.55", "--failure-detection", "0.3", *CONTENDED],
}

KEYS = ("rank", "iter", "time", "compute_s", "slowdown", "wait_s", "wait_updates_s", "wait_tokens_s",
        "wait_acks_s", "waited_on", "jumped_from", "jump", "sent", "sent_to", "send_skipped", "tokens",
        "reduced", "held", "used_total", "dropped_total", "version", "gap", "t_recv", "t_push", "push_s",
        "staleness", "event", "workers", "weights", "steps", "gaps", "reason", "kind", "applied", "dropped",
        "work", "elapsed", "wait_sends_s", "sent_bytes", "send_s", "reduce_s", "apply_s", "what", "round",
        "local_step", "local_steps", "round_steps")
"""The record fields hashed: times and protocol decisions (a field added later is not, so another change
that only adds fields to the logs leaves the golden values as they are)."""


def _links_file(tmp):
    """A hierarchical-style graph with per-node NICs and per-edge bandwidth and latency."""
    from hopdec import topology as T
    g = T.GENERATORS["ring-based"](8)
    for v in (0, 4):
        g.nodes[v]["bandwidth"] = 0.5
    for u, v in list(g.edges()):
        if u != v and (u < 4) != (v < 4):
            g.edges[u, v]["bandwidth"] = 0.25
            g.edges[u, v]["latency"] = 0.003
    path = os.path.join(tmp, "links.json")
    T.save(g, path)
    return ["--topology", path, "--iterations", "30", *CONTENDED]


def run_case(name, tmp):
    argv = CASES[name] if CASES[name] is not None else _links_file(tmp)
    log_dir = os.path.join(tmp, name)
    args = parse(argv + ["--invariants", "off", "--log-dir", log_dir])
    res = simulate(args, out=io.StringIO())
    h = hashlib.sha256()
    for f in sorted(os.listdir(log_dir), key=lambda s: (len(s), s)):
        if not f.startswith("rank"):
            continue
        with open(os.path.join(log_dir, f)) as fh:
            for line in fh:
                rec = json.loads(line)
                if "run" in rec:
                    continue
                h.update(json.dumps({k: rec[k] for k in KEYS if k in rec}, sort_keys=True).encode())
    net = res["sim"].net
    return dict(virtual_s=repr(float(res["virtual_s"])), max_gap=int(res["max_gap"]), events=res["events"],
                transfers=net.transfers, controls=net.controls, logs=h.hexdigest()[:20])


GOLDEN = {
    'double-ring-queue-only': dict(virtual_s='20.13265920000001', max_gap=2, events=644,
        transfers=1920, controls=0, logs='0824b87ad759db1c12d7'),
    'exponential-backup-copy-path': dict(virtual_s='4.1873486025458275', max_gap=1, events=1360,
        transfers=1920, controls=1392, logs='ae2ea3e332de4cd2b94a'),
    'exponential-backup-push': dict(virtual_s='5.580502402274939', max_gap=1, events=6035,
        transfers=1920, controls=5232, logs='cb7ad01ab25e2323961f'),
    'exponential-backup-zero-copy': dict(virtual_s='4.1873486025458275', max_gap=1, events=1360,
        transfers=1920, controls=1392, logs='4364982888bdddb666ad'),
    'exponential-churn-push': dict(virtual_s='16.327680670927535', max_gap=2, events=34431,
        transfers=8065, controls=20680, logs='a59171b3834d29f670e7'),
    'exponential-free-network': dict(virtual_s='2.329411260728595', max_gap=3, events=1888,
        transfers=3200, controls=2432, logs='6c8f71f6e55753d39b83'),
    'exponential-straggler-backup-skip': dict(virtual_s='9.030167748246967', max_gap=4, events=2886,
        transfers=2230, controls=1873, logs='4fade9339b5460967f02'),
    'links-from-file': dict(virtual_s='6.129797760000002', max_gap=1, events=813,
        transfers=720, controls=0, logs='fd5741dbea056c34d4dd'),
    'one-peer-exponential': dict(virtual_s='3.120189367578266', max_gap=4, events=3140,
        transfers=640, controls=2336, logs='f82e6312d98009f9502f'),
    'one-peer-exponential-topk-staleness-skip': dict(virtual_s='6.3208409920314', max_gap=4, events=2028,
        transfers=640, controls=2336, logs='cc14fa664d5603997ce4'),
    'ps-asp-deaths': dict(virtual_s='4.652257898315571', max_gap=3, events=635,
        transfers=194, controls=6, logs='8858d369b9067d9d5db2'),
    'ps-asp-fast-server': dict(virtual_s='2.1127049919464485', max_gap=2, events=3297,
        transfers=382, controls=12, logs='404bc87ee5a8c5852463'),
    'ps-backup': dict(virtual_s='8.777288874437376', max_gap=1, events=671,
        transfers=254, controls=8, logs='20e6d17c76a2f9f978a3'),
    'ps-bsp': dict(virtual_s='12.255160657596772', max_gap=0, events=912,
        transfers=360, controls=12, logs='e8756c8e4d0240ba3979'),
    'ps-bsp-deaths-detected': dict(virtual_s='6.705198877998747', max_gap=0, events=473,
        transfers=185, controls=6, logs='e72f7d200fdb7287e048'),
    'ps-dssp': dict(virtual_s='5.814499350991006', max_gap=2, events=838,
        transfers=254, controls=8, logs='2c2d1a77a4d184e55b9d'),
    'ps-elastic': dict(virtual_s='7.114284086822864', max_gap=3, events=778,
        transfers=254, controls=8, logs='687eb326198301271da7'),
    'ps-esync-half-duplex': dict(virtual_s='6.762353247395336', max_gap=5, events=968,
        transfers=192, controls=456, logs='eed0b219e593eaef4bbd'),
    'ps-ssp': dict(virtual_s='5.691733176927483', max_gap=3, events=810,
        transfers=250, controls=8, logs='3aa651b9780f57d6f2ec'),
    'ring-based-128': dict(virtual_s='3.1734795326013456', max_gap=2, events=3284,
        transfers=4608, controls=0, logs='b29751a5a906114e09f0'),
    'ring-based-contended': dict(virtual_s='3.02139888', max_gap=0, events=757,
        transfers=1440, controls=0, logs='8e07b39198f314d7cae3'),
    'ring-based-deaths-healed': dict(virtual_s='4.4181577439999975', max_gap=2, events=752,
        transfers=1489, controls=0, logs='54749c8521d7fbd41796'),
    'ring-based-int8': dict(virtual_s='1.2187497257346895', max_gap=2, events=1265,
        transfers=1440, controls=0, logs='1250808ea19df0e87ab2'),
    'ring-based-local-steps-int8': dict(virtual_s='2.3148563559205', max_gap=4, events=618,
        transfers=480, controls=0, logs='2fbf930c0ae207d0c6fd'),
    'ring-based-mixed-no-latency': dict(virtual_s='1.7234605140739652', max_gap=4, events=767,
        transfers=1440, controls=0, logs='0603a7774258006ea78f'),
    'ring-based-small-eager': dict(virtual_s='2.2664241599999992', max_gap=0, events=757,
        transfers=1440, controls=0, logs='556610de5a664b9f17c9'),
    'ring-notify-ack-serial': dict(virtual_s='3.1894767117652445', max_gap=1, events=1166,
        transfers=480, controls=480, logs='44b1a52a570868249e5b'),
    'torus-hybrid-half-duplex': dict(virtual_s='8.053113679999997', max_gap=2, events=545,
        transfers=1920, controls=0, logs='11c4b449d96221391988'),
    'torus-shm-take-staleness': dict(virtual_s='4.026581839999999', max_gap=2, events=558,
        transfers=1920, controls=0, logs='044905e7b0c6bac93cdc'),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulated_runs_are_unchanged(name, tmp_path):
    assert run_case(name, str(tmp_path)) == GOLDEN[name]


if __name__ == "__main__" and "--record" in sys.argv:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        print("GOLDEN = {")
        for name in sorted(CASES):
            r = run_case(name, tmp)
            print(f"    {name!r}: dict(virtual_s={r['virtual_s']!r}, max_gap={r['max_gap']}, events={r['events']},\n"
                  f"{' ' * 8}transfers={r['transfers']}, controls={r['controls']}, logs={r['logs']!r}),")
        print("}")
