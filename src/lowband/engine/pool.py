"""Parallel local workers: the step calls of one step run in worker processes.

``[engine] workers = "auto" | N`` (default ``"auto"``). ``N > 1`` starts ``N`` worker
processes at the start of the run; each is a :class:`~lowband.engine.rounds.Place`, the
home of a contiguous block of nodes (their data, inherited from the parent when the
platform forks, their states, one module per architecture, their codec states), exactly
as a Ray shard is, so the round is the one round loop of :mod:`lowband.engine.rounds`:
node states stay in the workers, only the step's arguments, the encoded messages between
workers, the ledger records and the states of visiting nodes cross the pipes. Placement
is balanced per round (:mod:`lowband.engine.placement`): when a round's actors are
unevenly spread over the homes (FedAvg's 10 sampled clients of 100), some visit the
other worker for the round, their states (and codec states) moving there and back; a
forked worker holds every node's data (shared pages), so the data stays put. Each worker runs ``threads`` torch threads (the
config's ``threads``, else ``cores // workers``), so the workers never oversubscribe the
cores. Results are byte-identical to ``workers = 1`` run with the same ``threads``
(tests/test_pool.py): torch's float reductions depend on the thread count, not on the
process.

``"auto"`` (:func:`resolve_workers`): one worker per ``threads`` cores (the cores the
process may use, :func:`usable_cores`) when there are at least two and the federation
is big enough to pay for the start-up (model parameters x training samples of all nodes
>= :data:`AUTO_MIN_WORK`), else the serial path in this process. ``workers = 1`` is the
serial path.
"""

from __future__ import annotations

import copyreg
import gc
import io
import multiprocessing as mp
import os
import pickle
import struct
import traceback
import types
import weakref
from typing import Any, Optional, Union

import torch

from lowband.algorithms.base import SERVER
from lowband.engine.executor import NodeEnv, SerialExecutor
from lowband.engine.rounds import Place, PutCache, ShardedExecutor
from lowband.topology import RoundPlan

__all__ = ["PoolExecutor", "resolve_workers", "usable_cores", "AUTO_MIN_WORK"]

#: ``workers = "auto"`` starts a pool when model parameters x training samples (all nodes)
#: reach this: FMNIST CNN federations (~1e10) do, the embedded digits tests (~1e6) do not
AUTO_MIN_WORK = 1e9


def usable_cores() -> int:
    """The cores this run may use: those the process may run on (``os.sched_getaffinity``),
    at most ``OMP_NUM_THREADS`` when that is set (a shared machine's way of giving a
    command fewer cores; it also caps torch's threads)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        n = min(n, int(omp))
    return max(1, n)


def resolve_workers(workers: Union[str, int], threads: Optional[int], num_nodes: int,
                    model_params: int, train_samples: int) -> int:
    """How many worker processes run the round (1: serially in this process)."""
    if workers == "auto":
        w = usable_cores() // max(1, int(threads or 1))
        if w < 2 or num_nodes < 2 or model_params * train_samples < AUTO_MIN_WORK:
            return 1
        return min(w, num_nodes)
    return max(1, min(int(workers), max(num_nodes, 1)))


# --------------------------------------------------------------------------- pickling


def _mappingproxy(d: dict) -> types.MappingProxyType:
    return types.MappingProxyType(d)


#: bytes objects at least this long (encoded messages, tensor storages) travel as frames of
#: their own beside the pickle, not copied into it (memory and time: no second copy of a
#: step's messages on either side of a pipe)
_FRAME_BYTES = 1 << 16


class _Pickler(pickle.Pickler):
    # round plans hold read-only mapping proxies, which plain pickle refuses
    dispatch_table = copyreg.dispatch_table.copy()
    dispatch_table[types.MappingProxyType] = lambda m: (_mappingproxy, (dict(m),))

    def __init__(self, file: Any, frames: list[bytes]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.frames = frames

    def persistent_id(self, obj: Any) -> Optional[int]:
        if type(obj) is bytes and len(obj) >= _FRAME_BYTES:
            self.frames.append(obj)
            return len(self.frames) - 1
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, frames: list[bytes]):
        super().__init__(file)
        self.frames = frames

    def persistent_load(self, pid: Any) -> bytes:
        return self.frames[int(pid)]


def _dumps(obj: Any) -> tuple[bytes, list[bytes]]:
    """``obj`` pickled: the pickle (its first 8 bytes: how many frames follow) and the
    large bytes objects it refers to, as they are."""
    buf = io.BytesIO()
    buf.write(bytes(8))
    frames: list[bytes] = []
    _Pickler(buf, frames).dump(obj)
    head = buf.getbuffer()
    struct.pack_into("<Q", head, 0, len(frames))
    del head
    return buf.getvalue(), frames


def _send(conn: Any, packed: tuple[bytes, list[bytes]]) -> None:
    head, frames = packed
    conn.send_bytes(head)
    for f in frames:
        conn.send_bytes(f)


def _recv(conn: Any) -> Any:
    head = conn.recv_bytes()
    frames = [conn.recv_bytes() for _ in range(struct.unpack_from("<Q", head)[0])]
    return _Unpickler(io.BytesIO(memoryview(head)[8:]), frames).load()


class _Tok:
    """A reference to an argument already shipped to the worker."""

    __slots__ = ("token",)

    def __init__(self, token: int):
        self.token = token


# --------------------------------------------------------------------------- worker


class _WorkerPlace(Place):
    def __init__(self, ex: SerialExecutor, index: int, num: int):
        super().__init__(ex, index, num)
        self.cache: dict[int, Any] = {}

    def get(self, ref: Any) -> Any:
        return self.cache[ref]


def release_free_memory() -> None:
    """Give the allocator's free pages back to the system (glibc's ``malloc_trim``; a no-op
    elsewhere). A step call frees hundreds of 0.3 MB message tensors between bigger
    buffers; glibc keeps such holes resident (its mmap threshold rises after the first
    large free), so a worker's memory would grow by that each step (measured: ~200 MB of
    free heap per DFedAvg worker). Costs a few milliseconds per call."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


_LIBC: list[Any] = []
#: the calls after which a worker trims its heap: those that make and drop many messages
#: (evaluation calls allocate little, and there are many of them: trimming costs ~10 ms)
_TRIM_AFTER = frozenset({"step", "run_step", "init_states", "set_states", "get_states"})


def _libc() -> Any:
    if not _LIBC:
        try:
            import ctypes

            lib = ctypes.CDLL("libc.so.6")
            lib.malloc_trim  # noqa: B018 - glibc only
            _LIBC.append(lib)
        except (OSError, AttributeError):
            _LIBC.append(None)
    return _LIBC[0]


def _serve(conn: Any, env: NodeEnv, index: int, num: int, threads: int) -> None:
    """A worker's loop: calls on its place, until the parent says stop (None) or goes."""
    import signal

    # a forked worker inherits `lowband run`'s SIGTERM-as-interrupt handler; the parent
    # terminates a stuck worker with SIGTERM, which should end it quietly, as by default
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gc.enable()
    torch.set_num_threads(int(threads))
    place = _WorkerPlace(SerialExecutor(env), index, num)
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            return
        if msg is None:
            return
        method, args, new, drop = msg
        del msg  # the call owns its arguments (Place.step frees delivered bytes as it decodes)
        place.cache.update(new)
        for t in drop:
            place.cache.pop(t, None)
        try:
            args = [place.cache[a.token] if isinstance(a, _Tok) else a for a in args]
            out: tuple = ("ok", getattr(place, method)(*args))
        except Exception as exc:  # reported to the parent, which raises it
            out = ("err", exc, traceback.format_exc())
        del args
        try:
            data = _dumps(out)
        except Exception as exc:  # an unpicklable result or exception
            data = _dumps(("err", RuntimeError(f"{type(exc).__name__}: {exc}"), traceback.format_exc()))
        del out
        _send(conn, data)
        del data
        if method in _TRIM_AFTER:
            release_free_memory()


def _shutdown(conns: list[Any], procs: list[Any]) -> None:
    for c in conns:
        try:
            _send(c, _dumps(None))
        except (OSError, ValueError):
            pass
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.terminate()
    for c in conns:
        c.close()


# --------------------------------------------------------------------------- parent


class PoolExecutor(ShardedExecutor):
    """``num_workers`` worker processes, each owning a block of nodes (see the module
    docstring). ``threads``: torch threads per worker (None: cores // workers).
    ``start_method``: multiprocessing's ("fork" where available: the data is inherited,
    not copied; else "spawn")."""

    def __init__(self, env: NodeEnv, *, num_workers: int, threads: Optional[int] = None,
                 start_method: Optional[str] = None):
        super().__init__()
        self.env = env
        self.num_workers = max(1, min(int(num_workers), max(env.num_nodes, 1)))
        self.threads = int(threads or max(1, usable_cores() // self.num_workers))
        method = start_method or ("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        ctx = mp.get_context(method)
        # balanced placement: a round's actors may visit the other worker; forked workers
        # hold every node's data (the parent's pages, shared, not copied), spawned ones
        # their own nodes' and receive a visitor's data with its state
        self.balance = True
        self.data_everywhere = method == "fork"
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        # forked workers share the parent's pages until written; the collector would write
        # to every object header it visits (memory: gc.freeze, as Python's docs advise)
        frozen = method == "fork" and gc.isenabled()
        if frozen:
            gc.disable()
            gc.freeze()
        try:
            for j in range(self.num_workers):
                parent, child = ctx.Pipe()
                env_j = self.shard_env(j, all_data=self.data_everywhere)
                proc = ctx.Process(target=_serve, args=(child, env_j, j, self.num_workers, self.threads),
                                   daemon=True, name=f"lowband-worker-{j}")
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
        finally:
            if frozen:
                gc.unfreeze()
                gc.enable()
        self._finalizer = weakref.finalize(self, _shutdown, self._conns, self._procs)
        self._cache = PutCache(32)
        self._objs: dict[int, Any] = {}  # token -> object, while cached
        self._sent: list[set[int]] = [set() for _ in range(self.num_workers)]
        self._drop: list[list[int]] = [[] for _ in range(self.num_workers)]
        self._next = 0
        self._closed: Optional[tuple[dict, dict]] = None  # (states, codec states) after close()

    # -- transport -------------------------------------------------------------------------
    def _token(self, obj: Any) -> int:
        tok = self._cache.get(obj)
        if tok is None:
            tok, self._next = self._next, self._next + 1
            self._objs[tok] = obj
            for gone in self._cache.add(obj, tok):
                self._objs.pop(gone, None)
                for j in range(self.num_workers):
                    if gone in self._sent[j]:
                        self._sent[j].discard(gone)
                        self._drop[j].append(gone)
        return tok

    def _put(self, obj: Any) -> tuple[str, Any]:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return ("val", obj)
        return ("ref", self._token(obj))

    def _plan(self, plan: RoundPlan) -> Any:
        return _Tok(self._token(plan))

    def _submit(self, j: int, method: str, *args: Any) -> int:
        if self._closed is not None:
            raise RuntimeError("the worker pool was closed at the end of the run; start a new Simulation")
        new = {t: o for t, o in self._objs.items() if t not in self._sent[j]}
        self._sent[j].update(new)
        drop, self._drop[j] = self._drop[j], []
        try:
            data = _dumps((method, args, new, drop))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise ValueError(f"the worker pool ships each call to its workers by pickle, and this one cannot be "
                             f"pickled ({str(exc).splitlines()[0]}); define step and evaluation functions at module "
                             f"level, or set engine.workers = 1") from None
        _send(self._conns[j], data)
        del data
        return j

    def _wait(self, handles: list[int]) -> list[Any]:
        out, err = [], None
        for j in handles:
            try:
                status, *rest = _recv(self._conns[j])
            except (EOFError, OSError):
                raise RuntimeError(f"worker {j} (pid {self._procs[j].pid}) died (exit code "
                                   f"{self._procs[j].exitcode}); see its output above") from None
            if status == "err":
                err = err or rest
                out.append(None)
            else:
                out.append(rest[0])
        if err is not None:
            exc, tb = err
            raise exc from RuntimeError(f"in a worker process:\n{tb}")
        return out

    # -- life cycle ------------------------------------------------------------------------
    def worker_pids(self) -> list[int]:
        """The worker processes still running (their CPU time is the run's: :mod:`lowband.engine.cputime`)."""
        return [p.pid for p in self._procs if p.pid is not None and p.is_alive()]

    @property
    def states(self) -> dict[int, Any]:
        return dict(self._closed[0]) if self._closed is not None else super().states

    def codec_state_dict(self) -> dict[str, Any]:
        return dict(self._closed[1]) if self._closed is not None else super().codec_state_dict()

    def close(self) -> None:
        """Keep a snapshot of the states (still readable) and stop the workers, one at a
        time as its states arrive (memory: the snapshot and the workers' copies are never
        all held at once)."""
        if self._closed is None:
            states: dict[int, Any] = {}
            codecs: dict[str, Any] = {}
            for j in range(self.num_workers):
                states.update(self._wait([self._submit(j, "get_states")])[0])
                codecs.update(self._wait([self._submit(j, "get_codec_states")])[0])
                _shutdown([self._conns[j]], [self._procs[j]])
            order = [n for n in range(self.env.num_nodes) if n in states] + ([SERVER] if SERVER in states else [])
            self._closed = ({n: states[n] for n in order}, {k: codecs[k] for k in sorted(codecs, key=int)})
            self._finalizer()
