"""Opening the files a user (or anyone who can write where they point) gives hopdec: never block, never read
without end, never follow a planted link when writing.

Reading (topology files, checkpoint manifests and arrays, run logs): only a regular file is read, at most
a cap of bytes. The file is opened with ``O_NONBLOCK`` -- opening a FIFO for reading would otherwise wait
for a writer forever -- and checked with ``fstat`` *after* opening, so what is read is what was checked
(``/dev/zero`` behind a symlink reports size 0 to ``stat`` but is a character device). Every refusal is a
:class:`hopdec.errors.HopdecError` (the class the caller gives) with one line naming the file.

Writing: what the system refuses while a run writes its logs, checkpoints or results (a full disk, a
quota, a mount gone away) ends the run with one line naming the file (:func:`writing`), not a traceback.
A resumed run continues its logs from where they stood at its checkpoint (:func:`trim_log`).
:func:`create_exclusive` makes a new file that did not exist (``O_CREAT | O_EXCL``, which also
refuses to follow a symlink at that name), so a link planted at a predictable temporary name cannot
redirect the write (see :func:`atomic_write`, which checkpoints, manifests and topology files are written
through: a reader, or a write stopped by Ctrl-C or a full disk, never leaves a part of one).
"""

import os
import secrets
import stat
from contextlib import contextmanager

from hopdec.errors import ConfigError, RunError


def shown(path):
    """The path as a message shows it: quoted when empty, padded or unprintable."""
    p = os.fspath(path)
    return p if p and p.strip() == p and p.isprintable() else repr(p)


def open_regular(path, max_bytes, what="the file", error=ConfigError):
    """``(binary file object, size)`` of ``path`` if it is a regular file of at most ``max_bytes``; else
    ``error`` naming the file and the problem (``what`` says what the file should have been)."""
    name = shown(path)
    if os.fspath(path) == "":
        raise error(f"{name}: an empty path, expected {what}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{name}: no such file (expected {what})") from None
    except IsADirectoryError:
        raise error(f"{name}: is a directory, not {what}") from None
    except OSError as err:
        raise error(f"{name}: cannot read ({err.strerror or err})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{name}: is a directory, not {what}")
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{name}: not a regular file (a FIFO, device or socket would block or never end); "
                        f"expected {what}")
        if st.st_size > max_bytes:
            raise error(f"{name}: {st.st_size} bytes, more than {what} may have ({max_bytes} bytes)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path, max_bytes, what="the file", error=ConfigError):
    """The bytes of ``path`` (see :func:`open_regular`); a file that grew past the cap while read is
    refused too."""
    fh, _ = open_regular(path, max_bytes, what, error)
    try:
        with fh:
            raw = fh.read(max_bytes + 1)
    except OSError as err:
        raise error(f"{shown(path)}: cannot read ({err.strerror or err})") from None
    if len(raw) > max_bytes:
        raise error(f"{shown(path)}: more than {what} may have ({max_bytes} bytes)")
    return raw


def create_exclusive(path, mode=0o644):
    """A new file at ``path`` opened for binary writing; FileExistsError if anything -- a file, a directory,
    a symlink (followed or not) -- is there already."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, mode), "wb")


def write_failed(path, err):
    """The one line for an ``OSError`` raised while writing ``path``: a :class:`RunError` naming it."""
    return RunError(f"cannot write {shown(path)}: {err.strerror or err}")


@contextmanager
def writing(path, mode=None):
    """Writes to ``path`` inside: an ``OSError`` (no space left, a quota, an I/O error) becomes
    :func:`write_failed`'s one line. With ``mode`` (``"w"``, ``"a"``) it opens the file and gives it."""
    try:
        if mode is None:
            yield None
        else:
            with open(path, mode) as f:
                yield f
    except OSError as err:
        raise write_failed(path, err) from None


def log_continues(path, offset):
    """Whether ``path`` can be cut back to ``offset`` bytes for a resumed run to append to: it exists, holds
    at least that much, and ``offset`` ends a line (a resumed log never continues a partial line)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    if offset is None or size < offset:
        return False
    if offset:
        with open(path, "rb") as f:
            f.seek(offset - 1)
            if f.read(1) != b"\n":
                return False
    return True


def trim_log(path, offset):
    """Cut ``path`` back to ``offset`` bytes (what it held at the checkpoint a run resumes), so the resumed
    run appends after it; True when it did (False, the file untouched: :func:`log_continues` says no, and
    the log starts afresh)."""
    if not log_continues(path, offset):
        return False
    with open(path, "r+b") as f:
        f.truncate(offset)
    return True


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, write):
    """Write ``path`` through ``write(file)`` into a temporary file beside it, fsync, rename: readers see
    the old file or the complete new one, never a part. The temporary name is unpredictable and the file is
    created exclusively (:func:`create_exclusive`): a symlink planted where it would be is
    never followed, and the rename replaces a link at ``path`` itself, not what it points to."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}-{secrets.token_hex(6)}")
    try:
        with create_exclusive(tmp) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(err, OSError):    # a full disk, a quota: one line naming the file (hopdec.files)
            raise write_failed(path, err) from None
        raise
    _fsync_dir(directory)
