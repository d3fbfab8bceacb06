"""Many processes: JAX's multi-controller runtime (``jax.distributed``), one process per host (or
several on one machine), one global mesh, every process running the same program.

Call :func:`initialize` on every process before anything else touches JAX (it reads
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``): it wraps
``jax.distributed.initialize`` with short fault timeouts (:data:`HEARTBEAT_TIMEOUT_S`) and, on
CPU, gloo collectives; a collective in flight when a peer dies fails with :class:`PeerFailure`.
The rest is the small host-side exchange :class:`~dsbd_jax.parallel.ShardedDecoder` uses: a
check that every process agrees on the settings and an allgather of prompt ids, lengths and keys
(kilobytes; the model and caches are never exchanged this way). How fast a failure is noticed:
``docs/results/design_notes.md``.
"""

from __future__ import annotations

import functools
import inspect
import os
import zlib
from typing import Dict, Optional, Sequence

import jax
import numpy as np

ENV_ADDRESS, ENV_COUNT, ENV_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
# a dead peer is detected by the coordination service's heartbeat within this many seconds
HEARTBEAT_TIMEOUT_S = 10
INIT_TIMEOUT_S = 120
SHUTDOWN_TIMEOUT_S = 20
CPU_COLLECTIVES = "jax_cpu_collectives_implementation"


class PeerFailure(RuntimeError):
    """A computation across processes failed, most likely because another process died or was
    killed (its connections closed). The other processes cannot go on: the coordination service
    also ends every process within ``heartbeat_timeout_seconds`` of a process's death."""

    def __init__(self, what: str, error: Exception):
        super().__init__(
            f"{what} failed on process {jax.process_index()} of {jax.process_count()}: a "
            f"collective across processes broke, most likely because another process died or was "
            f"killed (see its log). This process cannot go on. Cause: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}")


def env_settings(environ=None) -> Optional[Dict]:
    """``{coordinator_address, num_processes, process_id}`` from the environment (None when
    ``JAX_COORDINATOR_ADDRESS`` is unset); ``ValueError`` for a partial or malformed setting."""
    env = os.environ if environ is None else environ
    if not env.get(ENV_ADDRESS):
        return None
    try:
        count, pid = int(env[ENV_COUNT]), int(env[ENV_ID])
    except (KeyError, ValueError):
        raise ValueError(f"{ENV_ADDRESS} is set, so {ENV_COUNT} and {ENV_ID} must be integers; "
                         f"got {env.get(ENV_COUNT)!r}, {env.get(ENV_ID)!r}") from None
    if count < 1 or not 0 <= pid < count:
        raise ValueError(f"{ENV_ID}={pid} must be in [0, {ENV_COUNT}={count})")
    return dict(coordinator_address=env[ENV_ADDRESS], num_processes=count, process_id=pid)


def accepted_kwargs(fn, kwargs: Dict) -> Dict:
    """``kwargs`` less the names ``fn`` does not take (timeouts differ between jax versions)."""
    names = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in names}


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, *,
               heartbeat_timeout_seconds: int = HEARTBEAT_TIMEOUT_S,
               initialization_timeout: int = INIT_TIMEOUT_S,
               shutdown_timeout_seconds: int = SHUTDOWN_TIMEOUT_S, **kwargs) -> bool:
    """``jax.distributed.initialize`` for this process. Arguments left out are read from
    :func:`env_settings`; with neither, nothing happens and False is returned (one process).
    Sets the gloo CPU collectives (needed for a CPU mesh across processes). Call it once per
    process, before any other JAX call. Returns True once initialized."""
    given = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                 process_id=process_id)
    if coordinator_address is None:
        env = env_settings()
        if env is None:
            return False
        given = {k: v if v is not None else env[k] for k, v in given.items()}
    if CPU_COLLECTIVES in jax.config.values:      # a jax without the option has one choice
        jax.config.update(CPU_COLLECTIVES, "gloo")
    opts = dict(heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                initialization_timeout=initialization_timeout,
                shutdown_timeout_seconds=shutdown_timeout_seconds, **kwargs)
    jax.distributed.initialize(**given, **accepted_kwargs(jax.distributed.initialize, opts))
    return True


def process_share(n: int, index: Optional[int] = None, count: Optional[int] = None) -> slice:
    """Rows ``[start, stop)`` of ``n`` that process ``index`` of ``count`` takes (contiguous, the
    first ``n % count`` processes one more), e.g. 8 rows over 3 processes: 3, 3, 2."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (index < extra))


def fingerprint(*parts) -> int:
    """A 31-bit checksum of ``repr(parts)``, equal across processes for equal settings."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def allgather(x: np.ndarray) -> np.ndarray:
    """``[N, *x.shape]``: every process's ``x`` (same shape and dtype on all), in process order."""
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=False))


# one row of the header each process sends before any prompt: what every process must agree on
HEADER = ("error", "rows", "width", "key_kind", "key_hash", "settings")


def check_headers(headers: np.ndarray, own_error: Optional[Exception] = None) -> None:
    """``headers [N, len(HEADER)]`` (:data:`HEADER`, one row per process): the same
    ``ValueError`` on every process when any process rejected its input or the processes
    disagree on the prompt width, the key or the decode settings. ``own_error``: this process's
    own rejection, raised as is."""
    h = {name: headers[:, i].tolist() for i, name in enumerate(HEADER)}
    if own_error is not None:
        raise own_error
    bad = [p for p, e in enumerate(h["error"]) if e]
    if bad:
        raise ValueError(f"process(es) {bad} rejected their prompts (see their own error); "
                         f"no process decodes")
    if not sum(h["rows"]):
        raise ValueError("no process passed a prompt")
    if len(set(h["width"])) > 1:
        raise ValueError(f"every process must pass prompts of the same width (pad each batch "
                         f"to one bucket); widths by process: {h['width']}")
    if len(set(h["settings"])) > 1:
        raise ValueError("the processes built different decoders (method, config or mesh "
                         f"differ); settings checksums by process: {h['settings']}")
    if len(set(h["key_kind"])) > 1 or (h["key_kind"][0] == 1 and len(set(h["key_hash"])) > 1):
        raise ValueError("every process must pass the same PRNG key (one key for the whole "
                         "batch) or each a batch of keys for its own rows; "
                         f"key kinds by process (0 none, 1 one key, 2 a batch): {h['key_kind']}, "
                         f"key checksums: {h['key_hash']}")


def concat_rows(stacked: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """``stacked [N, R, ...]`` (every process's rows padded to ``R``) -> ``[sum(counts), ...]``:
    the first ``counts[p]`` rows of each process, in process order."""
    return np.concatenate([stacked[p, :c] for p, c in enumerate(counts)])


def row_offsets(counts: Sequence[int]) -> np.ndarray:
    """``[N + 1]``: process ``p``'s rows are ``[offsets[p], offsets[p + 1])`` of the batch."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def key_parts(key, n: int):
    """``(kind, checksum, raw keys)`` of a decoder's ``key`` for ``n`` rows: kind 1 for one key
    (checksum of its bits; every process must pass the same), kind 2 for a batch of ``n`` keys
    (raw ``uint32 [n, 2]``, this process's rows). ``ValueError`` for anything else."""
    from dsbd_jax.decoding._jit import inputs
    inputs.check_key(key, n)
    raw = np.asarray(jax.random.key_data(key) if inputs.is_typed_key(key) else key, np.uint32)
    if raw.ndim == 1:
        return 1, fingerprint(raw.tolist()), None
    return 2, 0, raw.reshape(n, -1)


def pack_rows(ids: np.ndarray, lengths: np.ndarray, keys: Optional[np.ndarray], rows: int
              ) -> np.ndarray:
    """``int64 [rows, P + 1 + K]``: ``ids [n, P]``, ``lengths [n]`` and raw ``keys [n, K]`` (K = 0
    without) side by side, zero rows past ``n`` (what :func:`allgather` sends)."""
    n = ids.shape[0]
    parts = [ids, lengths[:, None]] + ([keys] if keys is not None else [])
    out = np.zeros((rows, sum(p.shape[1] for p in parts)), np.int64)
    out[:n] = np.concatenate([p.astype(np.int64) for p in parts], axis=1)
    return out


def unpack_rows(rows: np.ndarray, width: int):
    """Inverse of :func:`pack_rows`: ``(ids int32 [B, P], lengths int32 [B], raw keys uint32
    [B, K] or None)``."""
    keys = rows[:, width + 1:]
    return (rows[:, :width].astype(np.int32), rows[:, width].astype(np.int32),
            keys.astype(np.uint32) if keys.shape[1] else None)


def fetch(tree, replicated):
    """A pytree of (global) ``jax.Array`` -> numpy, every leaf whole on every process: one
    program (compiled once per output structure) that replicates the tree with the sharding
    ``replicated`` (e.g. ``NamedSharding(mesh, P())``), then each process reads its own copy."""
    whole = _replicate(replicated)(tree)
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), whole)


@functools.lru_cache(maxsize=None)
def _replicate(replicated):
    return jax.jit(lambda tree: tree, out_shardings=replicated)
