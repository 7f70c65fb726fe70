"""Checkpoints on disk: each rank's state at a consistent cut, written atomically, and resuming from the
latest cut every rank has (``--checkpoint-dir D --checkpoint-every K``, ``--resume D``).

Layout: ``D/rank{r}/`` holds rank r's files only -- ``ckpt-{key:08d}.npz`` (numpy arrays: parameters,
momentum, data position, RNG states; a PS server also the pushed gradients it has not applied yet) and
``manifest.json`` (which keys are complete, the run's settings, where each rank's log was). A *key* names
a cut: the iteration K in decentralized mode (every rank at Enter(K), see
:mod:`hopdec.hop.cuts`), the server's cut number in parameter-server mode (see
:class:`hopdec.ps.server.Server`). Each rank reads only its own directory, so D may be a shared
filesystem or the same path on every host's local disk (as long as each rank runs where its files are).

Writes are atomic: a temporary file in the same directory, ``fsync``, ``rename``, then the manifest the
same way -- a rank killed mid-write leaves the previous checkpoints intact. Loading never unpickles:
``np.load(allow_pickle=False)`` refuses object arrays, and manifests are JSON.
"""

import json
import os
import secrets
import shlex
import time

import numpy as np

from hopdec.errors import ConfigError
from hopdec.files import atomic_write    # (checkpoints and manifests are written whole)
from hopdec.modes.fingerprint import SETTINGS  # what a resumed run must share with the one it resumes

FORMAT = "hopdec-checkpoint/1"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 * 2 ** 20


def option_name(key):
    return "--" + key.replace("_", "-")


def rank_dir(directory, rank):
    return os.path.join(directory, f"rank{rank}")


def ckpt_name(key):
    return f"ckpt-{int(key):08d}.npz"


# ---- atomic files --------------------------------------------------------------------------------
def write_arrays(path, arrays, meta):
    """``arrays`` (name -> numpy array, never objects) and a JSON ``meta`` into one ``.npz``, atomically."""
    payload = {k: np.asarray(v, order="C") for k, v in arrays.items()}   # (ascontiguousarray makes 0-d 1-d)
    for k, v in payload.items():
        if v.dtype == object:
            raise TypeError(f"checkpoint array {k} holds Python objects")
    payload["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    atomic_write(path, lambda f: np.savez(f, **payload))


def max_checkpoint_bytes():
    """Largest checkpoint file read: this host's memory (a file claiming more could not be loaded anyway)."""
    from hopdec.limits import host_memory_bytes
    return host_memory_bytes() or 2 ** 40


def _check_members(z, size, path):
    """Before any array is read: every member of the ``.npz`` is a ``.npy`` whose header asks for no more
    bytes than the member holds (a 1 KB file must not allocate gigabytes) and for no Python objects."""
    total = 0
    for info in z.infolist():
        if not info.filename.endswith(".npy"):
            raise ValueError(f"member {info.filename[:60]!r} is not a numpy array")
        total += info.file_size
        if total > max(size, 1) * 1024 + 2 ** 20:   # a stored .npz holds its arrays as they are
            raise ValueError(f"its members claim {total} bytes, far more than the {size}-byte file holds")
        with z.open(info) as m:
            version = np.lib.format.read_magic(m)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f"array {info.filename[:-4]!r}: .npy format version {version}")
            shape, _, dtype = read_header(m)
            if dtype.hasobject:
                raise ValueError(f"array {info.filename[:-4]!r} holds Python objects")
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if need > info.file_size:
                raise ValueError(f"array {info.filename[:-4]!r} claims {need} bytes in a {info.file_size}-byte "
                                 f"member")


def read_arrays(path):
    """``(arrays, meta)`` of a checkpoint file; ConfigError (one line naming the file and the problem) if
    it is missing, not a regular file, damaged, or holds anything but plain arrays. Nothing is unpickled
    (``allow_pickle=False``) and nothing is allocated before the headers are checked (:func:`_check_members`)."""
    import zipfile
    import zlib

    from hopdec.files import open_regular
    fh, size = open_regular(path, max_checkpoint_bytes(), "a hopdec checkpoint (.npz)")
    try:
        with fh:
            with zipfile.ZipFile(fh) as z:
                _check_members(z, size, path)
                bad = z.testzip()                   # every member's CRC: damage is found here, not mid-run
                if bad is not None:
                    raise ValueError(f"member {bad!r} is damaged (CRC mismatch)")
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        if "meta" not in arrays:
            raise ValueError("it has no meta record")
        meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError("not a hopdec checkpoint")
    except (ValueError, KeyError, OSError, EOFError, UnicodeDecodeError, RecursionError, MemoryError,
            zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, zlib.error) as err:
        msg = " ".join(str(err).split())[:200] or type(err).__name__
        if isinstance(err, zipfile.BadZipFile):
            msg = f"damaged or not a zip archive: {msg}"
        raise ConfigError(f"{path}: refused: not a readable hopdec checkpoint ({msg})") from None
    return arrays, meta


# ---- manifests ---------------------------------------------------------------------------------------
def read_manifest(directory, rank):
    """Rank ``rank``'s manifest in ``directory`` (a dict), or None when it has none. ConfigError naming the
    file when it is not a regular file of at most :data:`MAX_MANIFEST_BYTES`, not JSON, or not shaped as
    a manifest (keys that are iterations, entries naming a file)."""
    from hopdec.files import read_bytes
    path = os.path.join(rank_dir(directory, rank), MANIFEST)
    if not os.path.lexists(path):
        return None
    raw = read_bytes(path, MAX_MANIFEST_BYTES, "a hopdec checkpoint manifest")
    try:
        man = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ConfigError(f"{path}: unreadable checkpoint manifest ({' '.join(str(err).split())[:200]})") \
            from None
    if not isinstance(man, dict) or man.get("format") != FORMAT or not isinstance(man.get("complete"), dict):
        raise ConfigError(f"{path}: not a hopdec checkpoint manifest")
    for k, e in man["complete"].items():
        if not (isinstance(k, str) and k.isdigit() and len(k) < 16 and isinstance(e, dict)
                and isinstance(e.get("file"), str)):
            raise ConfigError(f"{path}: damaged checkpoint manifest (entry {str(k)[:20]!r} is not an "
                              f"iteration with a file)")
    def count(v, least):
        return isinstance(v, int) and not isinstance(v, bool) and v >= least
    for key, check in (("world", lambda v: count(v, 1)), ("checkpoint_every", lambda v: v is None or count(v, 0)),
                       ("iterations", lambda v: v is None or count(v, 0)),
                       ("settings", lambda v: isinstance(v, dict)), ("mode", lambda v: isinstance(v, str))):
        if key in man and not check(man[key]):
            raise ConfigError(f"{path}: damaged checkpoint manifest (its {key!r} is {str(man[key])[:30]!r})")
    return man


def check_fresh(directory, rank):
    """Setup check of ``--checkpoint-dir`` for a new run: writable, and not holding another run's
    checkpoints (they would be mixed up with this run's at a later ``--resume``)."""
    from hopdec.files import create_exclusive
    where = rank_dir(directory, rank)
    try:
        os.makedirs(where, exist_ok=True)
        probe = os.path.join(where, f".probe{os.getpid()}-{secrets.token_hex(6)}")
        with create_exclusive(probe):
            pass
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(f"--checkpoint-dir {directory}: cannot write {where} ({err.strerror or err})") \
            from None
    man = read_manifest(directory, rank)
    if man is not None and man["complete"]:
        last = max(int(k) for k in man["complete"])
        raise ConfigError(f"--checkpoint-dir {directory}: holds the checkpoints of another run (up to "
                          f"{_describe_key(man, last)}); continue it with --resume {directory}, or choose an "
                          f"empty directory")


def _describe_key(man, key):
    e = man["complete"].get(str(key), {})
    if man.get("mode") == "ps":
        return f"checkpoint {key}, {e.get('work', '?')} mini-batches"
    if isinstance(e.get("work"), int):             # --local-steps: the iterations are rounds
        return f"round {key}, {e['work']} inner steps"
    return f"iteration {key}"


class RankCheckpoints:
    """The checkpoints of one rank: writes them atomically, keeps the manifest, deletes old ones."""

    def __init__(self, directory, rank, world, mode, settings, every, target, extra=None, previous=None,
                 resumed=None):
        """``previous``: the manifest of the run this one resumes (its complete keys are kept, up to the key
        ``resumed`` from: later ones are of a future this run rewrites, and a later --resume must not pick
        one of them on a rank that has not rewritten it yet)."""
        self.dir = rank_dir(directory, rank)
        self.root, self.rank = directory, rank
        os.makedirs(self.dir, exist_ok=True)
        for name in os.listdir(self.dir):                      # a rank killed mid-write leaves these
            if name.startswith(".") and ".tmp" in name:
                try:
                    os.unlink(os.path.join(self.dir, name))
                except OSError:
                    pass
        self.manifest = dict(format=FORMAT, rank=rank, world=world, mode=mode, settings=settings,
                             checkpoint_every=every, iterations=target, **(extra or {}),
                             complete={k: e for k, e in previous["complete"].items()
                                       if resumed is None or int(k) <= resumed} if previous else {})
        self.saved_s = 0.0

    @property
    def keys(self):
        return sorted(int(k) for k in self.manifest["complete"])

    def save(self, key, arrays, info=None, also=(), state=None):
        """Write the arrays as checkpoint ``key`` (and record the same file for the keys ``also``: a rank
        whose state did not change between cuts), then the manifest. ``info`` goes into both (small),
        ``state`` (JSON) only into the file. Returns the file's path."""
        t0 = time.perf_counter()
        name = ckpt_name(key)
        path = os.path.join(self.dir, name)
        meta = dict(format=FORMAT, rank=self.rank, key=int(key), **(info or {}), state=state)
        write_arrays(path, arrays, meta)
        entry = dict(file=name, time=time.time(), **(info or {}))
        for k in (*also, key):
            self.manifest["complete"][str(int(k))] = entry
        self._write_manifest()
        self.saved_s += time.perf_counter() - t0
        return path

    def _write_manifest(self):
        text = json.dumps(self.manifest, indent=1, sort_keys=True).encode("utf-8")
        atomic_write(os.path.join(self.dir, MANIFEST), lambda f: f.write(text))

    def forget_before(self, key, keep=0):
        """Delete the checkpoints older than ``key`` (no longer needed by any resume) except ``keep`` (0:
        none): the manifest first, then the files no key refers to any more."""
        old = [k for k in self.manifest["complete"] if int(k) < key and int(k) != keep]
        if not old:
            return
        for k in old:
            del self.manifest["complete"][k]
        self._write_manifest()
        used = {e["file"] for e in self.manifest["complete"].values()}
        for name in os.listdir(self.dir):
            if name.startswith("ckpt-") and name.endswith(".npz") and name not in used:
                try:
                    os.unlink(os.path.join(self.dir, name))
                except OSError:
                    pass

    def load(self, key):
        return load(self.root, self.rank, self.manifest, key)


def path_of(directory, rank, manifest, key):
    """The file rank ``rank``'s manifest lists for checkpoint ``key``."""
    entry = manifest["complete"].get(str(int(key)))
    if entry is None:
        raise ConfigError(f"--resume {directory}: rank {rank} has no checkpoint {key}")
    return os.path.join(rank_dir(directory, rank), os.path.basename(str(entry.get("file", ""))))


def load(directory, rank, manifest, key):
    """The arrays of rank ``rank``'s checkpoint ``key`` (its manifest given), checked to be that one."""
    path = path_of(directory, rank, manifest, key)
    arrays, meta = read_arrays(path)
    problem = file_problem(arrays, meta, rank, key)
    if problem:
        raise ConfigError(f"{path}: refused: {problem}")
    return arrays, meta


_KINDS = {"params": "f", "rng/torch": "u", "rng/cuda": "u", "stream/generator": "u", "stream/pos": "i",
          "stream/perm": "i"}
"""The kind of numbers (numpy ``dtype.kind``) of the arrays every checkpoint of a trainer has."""


def file_problem(arrays, meta, rank, key):
    """Why a checkpoint file read intact is still not rank ``rank``'s state at checkpoint ``key`` (None when
    it is): another rank's; not the checkpoint the manifest lists it as (its own key says which it is, and
    a file may stand for earlier keys -- a PS worker whose state did not change between cuts -- never later
    ones); no parameters; numbers of the wrong kind, NaN or infinite; a data position that is
    none. What only the model can tell (shapes) is checked when it is loaded."""
    if meta.get("rank") != rank:
        return f"written by rank {meta.get('rank')}, not rank {rank}"
    saved = meta.get("key")
    if not isinstance(saved, int) or isinstance(saved, bool) or saved < int(key):
        return f"it is checkpoint {str(saved)[:20]}, not {key} as the manifest says (a file copied or renamed?)"
    if "params" not in arrays:
        return "it has no params"
    for name, a in arrays.items():
        kind = _KINDS.get(name)
        if kind is not None and a.dtype.kind != kind:
            return f"its {name} holds {a.dtype} values"
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            return f"its {name} holds NaN or infinite values"
    pos = arrays.get("stream/pos")
    if pos is not None and (pos.shape != (3,) or pos.min() < 0 or pos[2] > 1):
        return f"its stream/pos {pos.reshape(-1)[:3].tolist()} is no data position"
    return None


# ---- which checkpoint a resume starts from --------------------------------------------------------------
def summary(directory, rank):
    """What rank ``rank`` tells the others at ``--resume``: its manifest's keys and settings, or an error.
    Each listed checkpoint file is read and checked here (:func:`read_arrays`), during setup: a damaged
    file is a setup error naming it (exit 2), not a failure after training began."""
    try:
        man = read_manifest(directory, rank)
    except ConfigError as err:
        return {"error": str(err)}
    if man is None:
        return {"missing": True}
    damaged = {}
    for k, e in man["complete"].items():
        path = os.path.join(rank_dir(directory, rank), os.path.basename(e["file"]))
        try:
            arrays, meta = read_arrays(path)
            problem = file_problem(arrays, meta, rank, int(k))
            if problem:
                raise ConfigError(f"{path}: refused: {problem}")
        except ConfigError as err:
            damaged[k] = str(err)
    return {k: man.get(k) for k in ("world", "mode", "settings", "checkpoint_every", "iterations")} | \
        {"keys": sorted(int(k) for k in man["complete"]), "damaged": damaged,
         "work": {k: e["work"] for k, e in man["complete"].items() if isinstance(e.get("work"), int)}}


def choose(directory, summaries, world, settings, at=None):
    """The key every rank has, latest first (``at``: that one, ``--resume-at``), from every rank's
    :func:`summary` (the same answer on every rank, so a problem is one ConfigError raised everywhere).
    Checks the number of ranks and settings, and that the files of the chosen checkpoint are intact on
    every rank; when one is damaged, the line names the latest intact earlier one ``--resume-at`` can take."""
    where = f"--resume {directory}"
    for r, s in enumerate(summaries):
        if s.get("error"):
            raise ConfigError(f"{s['error']} (rank {r})")
    present = [s for s in summaries if not s.get("missing")]
    if not present:
        raise ConfigError(f"{where}: no checkpoint there (expected {directory}/rank0/{MANIFEST})")
    worlds = {s["world"] for s in present}
    if worlds != {world}:
        written = max(worlds)
        raise ConfigError(f"{where}: written by {written} ranks, this run has {world}: resume onto a "
                          f"different number of ranks is out of scope (mpirun -n {written})")
    missing = [r for r, s in enumerate(summaries) if s.get("missing")]
    if missing:
        r = missing[0]
        raise ConfigError(f"{where}: rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing[:8]))} "
                          f"of {world} {'have' if len(missing) > 1 else 'has'} no checkpoint there (no "
                          f"{os.path.join(rank_dir(directory, r), MANIFEST)}): the directory is incomplete")
    first = summaries[0]                                   # rank 0's: the server's, in PS mode
    for s in present[1:]:
        if s["settings"] != first["settings"] or s["mode"] != first["mode"]:
            raise ConfigError(f"{where}: the ranks' checkpoints are of different runs")
    mismatch = compare_settings(first["settings"], settings)
    if mismatch:
        raise ConfigError(f"{where}: {mismatch}")
    common = set(first["keys"])
    for s in present[1:]:
        common &= set(s["keys"])
    if not common:
        raise ConfigError(f"{where}: no checkpoint is complete on every rank (a run killed before its "
                          f"first checkpoint)")
    if at is not None and at not in common:
        have = ", ".join(map(str, sorted(common)[-8:]))
        raise ConfigError(f"{where} --resume-at {at}: not a checkpoint every rank has there (they have {have})")
    key = max(common) if at is None else at

    def damaged(k):
        return next(((r, s["damaged"][str(k)]) for r, s in enumerate(summaries)
                     if (s.get("damaged") or {}).get(str(k))), None)
    bad = damaged(key)
    if bad:
        earlier = next((k for k in sorted(common, reverse=True) if k < key and damaged(k) is None), None)
        hint = (f"; --resume-at {earlier} starts from the latest intact one before it" if earlier is not None
                else "; no intact earlier one every rank has")
        raise ConfigError(f"{bad[1]} (rank {bad[0]}; the checkpoint --resume would start from{hint})")
    return key, first


def compare_settings(saved, current):
    """None when a run with ``current`` settings may resume a checkpoint written with ``saved``; else one
    line naming the first option that differs."""
    for key in SETTINGS:
        a, b = saved.get(key), current.get(key)
        if a != b:
            return (f"the checkpoint was written with {option_name(key)} {_show(a)}, this run has "
                    f"{option_name(key)} {_show(b)}; resume with the same settings (only --iterations, "
                    f"--epochs, output and emulation options may change)")
    return None


def _show(v):
    if v is None:
        return "(not set)"
    if isinstance(v, dict):
        return v.get("describe", json.dumps(v, sort_keys=True))
    return str(v)


# ---- logs and messages ---------------------------------------------------------------------------------
def resume_command(argv, ranks, directory, launcher="mpirun"):
    """The command that resumes this run: the same ``hopdec train`` arguments, ``--resume D`` instead of
    any earlier ``--resume``, without the tests' fault injection. Started by a launch script, the script
    again (``HOPDEC_RESUME_WITH``: how it was invoked, e.g. ``launch/local.sh -n 4``; a plain ``mpirun``
    command needs the script's flags, --allow-run-as-root, --oversubscribe, ...), else ``mpirun -n N``."""
    out, skip = [], False
    drop = {"--resume", "--resume-at", "--die-rank", "--die-at", "--die-how", "--die-phase"}
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in drop:
            skip = "=" not in arg
            continue
        out.append(arg)
    script = _launch_script()
    head = script if script else [launcher, "-n", str(ranks), "hopdec", "train"]
    return shlex.join([*head, *out, "--resume", directory])


def _launch_script():
    """The launch script's invocation from ``HOPDEC_RESUME_WITH`` (shell words), or None when unset or not
    plain printable words (it is only printed, never run)."""
    text = os.environ.get("HOPDEC_RESUME_WITH", "")
    if not text or len(text) > 2000 or not text.isprintable():
        return None
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    return words or None

