"""Compressed exchanges and time-varying graphs in real ``mpirun`` jobs: fewer bytes on the wire (the
transport's own counters), the same training, and the combinations refused before training starts."""

import json

import pytest

from hopdec.transport import codec as C
from test_train_mpi import logs

COMMON = ["--no-progress", "--threads", "1", "--iterations", 60]
NUMEL = 151306                                   # the digits CNN's parameters
RUNS = {
    "none": ["--topology", "ring"],
    "int8": ["--topology", "ring", "--compress", "int8"],
    "topk": ["--topology", "ring", "--compress", "topk:0.05"],
    "one-peer-bf16": ["--topology", "one-peer-exponential", "--compress", "bf16", "--backup-workers", "0"],
    "one-peer-bf16-stale": ["--topology", "one-peer-exponential", "--compress", "bf16", "--backup-workers", "0",
                            "--staleness", "2"],
}
STALENESS = 2
REFUSED = [
    (["--mode", "ps", "--compress", "int8"], "--compress is not used in --mode ps"),
    (["--topology", "one-peer-exponential", "--protocol", "notify-ack"], "--protocol notify-ack: not with a "
                                                                          "time-varying topology"),
    (["--topology", "one-peer-exponential", "--backup-workers", "1"], "one in-neighbour per step"),
    (["--compress", "int4"], "--compress 'int4': expected none, fp16, bf16, int8 or topk:F"),
]


@pytest.fixture(scope="module")
def runs(mpirun, tmp_path_factory):
    """Every run in one ``mpirun -n 4`` job (the refused ones return 2 and the next starts)."""
    base = tmp_path_factory.mktemp("compress")
    argvs = [COMMON + argv + ["--log-dir", base / k] for k, argv in RUNS.items()]
    argvs += [COMMON[:-2] + ["--iterations", 3] + argv for argv, _ in REFUSED]
    outs = mpirun.batch(4, argvs, timeout=400)
    return {k: (out, base / k) for k, out in zip(RUNS, outs)}, outs[len(RUNS):]


def messages(d, rank):
    with open(d / f"rank{rank}.jsonl") as f:
        return [e for e in map(json.loads, f) if e.get("event") == "messages"][0]


def accuracy(out):
    return float(out.stdout.split("test accuracy")[1].split()[0])


def test_coded_runs_put_fewer_bytes_on_the_wire_and_train_as_well(runs):
    done, _ = runs
    for k, (out, _) in done.items():
        assert out.returncode == 0, out.stdout + out.stderr
    full = messages(done["none"][1], 0)
    assert full["bytes"] == full["updates"] * 4 * (NUMEL + 4)          # float32 + header, as before
    key = C.key_bytes(NUMEL)
    for k, spec in (("int8", "int8"), ("topk", "topk:0.05")):
        m = messages(done[k][1], 0)
        coded = C.message_bytes(spec, NUMEL)
        assert m["compress"] == spec and m["updates"] == full["updates"]
        assert m["key_messages"] == 2                                    # one per out-neighbour of the ring
        assert m["bytes"] == m["key_bytes"] + (m["updates"] - 2) * coded
        assert m["bytes"] < (0.27 if k == "int8" else 0.12) * full["bytes"] + 2 * key
        for rec in logs(done[k][1])[0][1:]:                               # per iteration, in the log
            assert rec["sent_bytes"] == 2 * coded
        assf = "traffic: rank 0 sent"
        assert assf in done[k][0].stdout and f"--compress {spec}" in done[k][0].stdout
    base = accuracy(done["none"][0])
    for k in ("int8", "topk", "one-peer-bf16"):          # no staleness: the same updates every time, one figure
        assert accuracy(done[k][0]) > min(0.85, base - 0.05), done[k][0].stdout


def test_stale_coded_updates_stay_in_the_window_and_the_run_learns(runs):
    """With --staleness the reduced updates depend on timing (the newest per sender, sec. 4.4), so this run's
    accuracy moves with the machine's load: 0.85-0.94 measured (33 runs, CI's load included). What must hold
    whatever the timing: every update reduced at iteration k is from k - s or later, and the model learns."""
    out, d = runs[0]["one-peer-bf16-stale"]
    assert out.returncode == 0, out.stdout + out.stderr
    assert "staleness+compress(bf16)" in out.stdout
    others = 0
    for r, recs in enumerate(logs(d)):
        for rec in recs:
            for group in rec.get("reduced") or []:
                for sender, it, _ in group:
                    if sender != r:
                        others += 1
                        assert it >= rec["iter"] - STALENESS, (r, rec)
    assert others > 0
    assert accuracy(out) > 0.7, out.stdout                # chance is 0.1; 0.85 the lowest seen


def test_a_one_peer_schedule_sends_to_one_peer_per_iteration_over_mpi(runs):
    done, _ = runs
    out, d = done["one-peer-bf16"]
    assert "+compress(bf16)" in out.stdout and "one-peer-exponential(4)" in out.stdout
    for r, recs in enumerate(logs(d)):
        for rec in recs:
            if rec.get("sent_to"):
                assert rec["sent_to"] == [(r + 2 ** (rec["iter"] % 2)) % 4]
    with open(d / "rank0.jsonl") as f:
        head = json.loads(f.readline())["run"]
    assert head["schedule"] == "time-varying, period 2" and head["compress"] == "bf16"
    m = messages(d, 0)
    assert m["key_messages"] == 2 and m["mirrors"] == 2                  # one stream per union out-edge


@pytest.mark.parametrize("case", range(len(REFUSED)), ids=[a[-1] for a, _ in REFUSED])
def test_what_cannot_combine_is_refused_in_one_line(runs, case):
    out, msg = runs[1][case], REFUSED[case][1]
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.startswith("hopdec train: error:")]
    assert len(lines) == 1 and msg in lines[0], out.stderr
