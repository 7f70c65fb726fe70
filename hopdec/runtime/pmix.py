"""The two requests hopdec makes to the job's process manager over PMIx: end the whole job, kill some ranks.

``MPI_Abort`` needs MPI to be initialised, and ULFM has no call that ends a failed peer: a rank stuck in
``MPI_Init``, or one stopped (SIGSTOP) after the survivors declared it dead, would keep ``mpirun`` waiting
forever. PMIx -- the interface Open MPI 5's ``mpirun`` (PRRTE) and Slurm's ``srun --mpi=pmix`` give every
process they start -- can do both from any thread: ``PMIx_Abort`` ends the job (every rank gets SIGCONT,
SIGTERM, SIGKILL from the launcher, stopped ones included) and ``PMIx_Job_control`` with
``pmix.jctrl.kill`` kills given ranks on whichever host they run. The library is the one MPI already
loaded (found in ``/proc/self/maps``), called through ctypes, which releases the GIL; every call is
bounded (:data:`CALL_TIMEOUT_S`). Each function returns False when PMIx is not there or refused (a
launcher without PMIx, another MPI), so the caller can fall back.
"""

import ctypes
import os
import threading

CALL_TIMEOUT_S = 5.0
PMIX_BOOL = 1                      # pmix_data_type_t of a bool
JOB_CTRL_KILL = b"pmix.jctrl.kill"
RANK_WILDCARD = 2 ** 32 - 2       # PMIX_RANK_WILDCARD: every rank of a namespace

_lib = None


def loaded_library(stem):
    """The path of a shared library this process has loaded whose name starts with ``stem``, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if os.path.basename(path).startswith(stem):
                    return path
    except OSError:
        pass
    return None


def library():
    """libpmix as ctypes sees it, once PMIx is initialised in this process (by MPI_Init); else None."""
    global _lib
    if _lib is None:
        path = loaded_library("libpmix.so")
        if path is None:
            return None
        try:
            lib = ctypes.CDLL(path)
            lib.PMIx_Initialized.restype = ctypes.c_int
            lib.PMIx_Abort.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
            lib.PMIx_Proc_create.restype = ctypes.c_void_p
            lib.PMIx_Proc_create.argtypes = [ctypes.c_size_t]
            lib.PMIx_Proc_load.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32]
            lib.PMIx_Proc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            lib.PMIx_Info_create.restype = ctypes.c_void_p
            lib.PMIx_Info_create.argtypes = [ctypes.c_size_t]
            lib.PMIx_Info_load.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint16]
            lib.PMIx_Info_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            lib.PMIx_Job_control.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_void_p, ctypes.c_void_p]
        except (OSError, AttributeError):
            return None
        _lib = lib
    try:
        return _lib if _lib.PMIx_Initialized() else None
    except OSError:
        return None


def _bounded(call):
    """``call()`` (a ctypes call: it releases the GIL) in a thread, waited for at most CALL_TIMEOUT_S;
    its result, or None when it did not return in time."""
    out = []
    t = threading.Thread(target=lambda: out.append(call()), daemon=True)
    t.start()
    t.join(CALL_TIMEOUT_S)
    return out[0] if out else None


def abort(code):
    """Ask the launcher to end the whole job with exit status ``code`` (every rank of this namespace);
    False when PMIx cannot. The caller exits next: under ULFM (``--with-ft ulfm``) the launcher acts on
    the request only once the requesting process has ended."""
    lib = library()
    nspace = os.environ.get("PMIX_NAMESPACE", "").encode()
    if lib is None or not nspace:
        return False

    def call():
        procs = lib.PMIx_Proc_create(1)
        try:
            lib.PMIx_Proc_load(procs, nspace, RANK_WILDCARD)
            return lib.PMIx_Abort(int(code), None, procs, 1)
        finally:
            lib.PMIx_Proc_free(procs, 1)
    return _bounded(call) == 0


def kill(ranks):
    """Have the launcher kill ranks ``ranks`` of this job (wherever they run; stopped processes too). True
    when it accepted the request."""
    ranks = sorted({int(r) for r in ranks})
    nspace = os.environ.get("PMIX_NAMESPACE", "").encode()
    lib = library()
    if not ranks or lib is None or not nspace:
        return False

    def call():
        procs = lib.PMIx_Proc_create(len(ranks))
        info = lib.PMIx_Info_create(1)
        try:
            for i, r in enumerate(ranks):
                lib.PMIx_Proc_load(procs + i * _PROC_SIZE, nspace, r)
            flag = ctypes.c_bool(True)
            lib.PMIx_Info_load(info, JOB_CTRL_KILL, ctypes.byref(flag), PMIX_BOOL)
            results, nresults = ctypes.c_void_p(), ctypes.c_size_t()
            return lib.PMIx_Job_control(procs, len(ranks), info, 1, ctypes.byref(results),
                                        ctypes.byref(nresults))
        finally:
            lib.PMIx_Info_free(info, 1)
            lib.PMIx_Proc_free(procs, len(ranks))
    return _bounded(call) == 0


_PROC_SIZE = 256 + 4
"""sizeof(pmix_proc_t): ``char nspace[PMIX_MAX_NSLEN + 1]`` (255 + 1) and a uint32 rank."""
