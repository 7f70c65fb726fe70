"""The validation's cases (hopdec.testbed.validate): every hand-picked and randomly drawn case is a run
``hopdec train`` and ``hopdec sim`` both accept (a refused option ends the whole validation job)."""

from hopdec.cli.sim import parse as sim_parse
from hopdec.cli.train import parse as train_parse
from hopdec.testbed import validate as V


def test_every_drawn_case_is_accepted_by_train_and_sim(tmp_path):
    cases = V.fixed() + V.sample(1, 40, work_dir=str(tmp_path))
    assert any("notify-ack" in c.argv for c in cases) and any("queue-only" in c.argv for c in cases)
    for c in cases:
        train_parse(V.train_argv(c, 60, tmp_path / "logs"))
        sim_parse(V.sim_argv(c, 60))
        sim_parse(V.sim_argv(c, 60, eager=4096, rendezvous="push"))   # (a PS case takes neither)
