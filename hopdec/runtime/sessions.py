"""Open MPI session folders left by killed launchers, which stop a later ``mpirun`` from starting.

``prterun`` (``mpirun``) and its daemons keep their session in ``${TMPDIR:-/tmp}/ompi.PID`` and
``prted.PID``, with PMIx rendezvous files (``pmix.HOST.tool*``: the address of the launcher's PMIx server)
that a clean exit removes and a SIGKILL leaves behind. Pids wrap (``pid_max`` is 32768 by default), and a
later ``mpirun`` given the same pid finds the old files and fails at once: "The PMIx server's listener
thread failed to start" (exit 213; seen twice in one CI run of this repository). The launchers
(``launch/_common.sh``) and the tests' ``mpirun`` remove such folders before they start a job.

A folder is removed only when all of these hold: it is this user's, its pid is no live process here, its
rendezvous files are over :data:`QUIET_S` old (a launcher that is starting has just written them), and
nothing answers at the addresses they name (a live job whose pid this host's process table does not show,
e.g. another PID namespace sharing the folder, still listens there). Standard library only: the launchers
run it before anything else is imported.
"""

import os
import re
import shutil
import socket
import stat
import sys
import time

QUIET_S = 60.0
"""Seconds a session's rendezvous files must be old before the folder can count as left behind."""

_NAME = re.compile(r"^(ompi|prted)\.(\d+)$")
_ADDRESS = re.compile(r"tcp([46])://\[?([0-9A-Fa-f.:]+?)\]?:(\d+)")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                 # (another user's process: alive)
        pass
    return True


def _answers(text, timeout=0.5):
    """Whether something accepts a connection at any address named in a rendezvous file's text."""
    for family, host, port in _ADDRESS.findall(text):
        fam = socket.AF_INET6 if family == "6" else socket.AF_INET
        try:
            with socket.socket(fam, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect((host, int(port)))
                return True
        except OSError:
            continue
    return False


def left_behind(folder):
    """Whether ``folder`` (``ompi.PID`` or ``prted.PID``) is a session a killed launcher left (see the module)."""
    m = _NAME.match(os.path.basename(folder))
    if m is None or _alive(int(m.group(2))):
        return False
    try:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():     # (a link is not a folder here)
            return False
        files = [os.path.join(folder, f) for f in os.listdir(folder) if f.startswith("pmix.")]
        if not files:
            return False                # (nothing in it stops a new launcher)
        now, texts = time.time(), []
        for f in files:
            fst = os.lstat(f)
            if not stat.S_ISREG(fst.st_mode) or now - fst.st_mtime < QUIET_S:
                return False
            with open(f, errors="replace") as fh:
                texts.append(fh.read(4096))
    except OSError:
        return False
    return not any(_answers(t) for t in texts)


def remove_left_behind(tmpdir=None):
    """Remove the session folders killed launchers left in ``tmpdir`` (default: ``$TMPDIR`` or /tmp, where
    Open MPI puts them); returns their paths."""
    tmpdir = tmpdir or os.environ.get("TMPDIR") or "/tmp"
    removed = []
    try:
        names = os.listdir(tmpdir)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(tmpdir, name)
        if _NAME.match(name) and left_behind(path):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(path)
    return removed


if __name__ == "__main__":          # python3 -m hopdec.runtime.sessions [-v]
    gone = remove_left_behind()
    if "-v" in sys.argv[1:]:
        for path in gone:
            print(f"removed {path} (a killed launcher's session)")
