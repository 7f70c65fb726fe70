"""The simulator's hot path is annotated (issue 21 item 4: for mypyc, kept after it); mypy keeps the
annotations true. Without this, nothing checked them: a speed-up that stored an Optional where a list was
promised, or bound a method of another signature, went unnoticed."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOT = ["hopdec/sim/events.py", "hopdec/sim/network.py", "hopdec/sim/hop.py", "hopdec/runtime/hop_loop.py",
       "hopdec/hop/worker.py", "hopdec/hop/receive.py", "hopdec/hop/update_queue.py", "hopdec/hop/token_queue.py",
       "hopdec/transport/message.py"]


def test_the_annotated_hot_path_type_checks():
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--config-file", "setup.cfg", *HOT],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found in 9 source files" in r.stdout
