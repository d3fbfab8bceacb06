"""Sharded decoding over a device mesh (``jax.sharding``): data parallel over prompts, tensor
parallel over the model, for every decoder (DSBD included).

    dec = ShardedDecoder(dsbd_generate, config, make_mesh(data=2, model=4))   # 8 devices
    params = dec.place({"target": target.params, "draft": draft.params})   # device_put, once
    out = dec(params, prompt_ids, key, prompt_lengths=lengths)             # same tokens as 1 device

Parameters are placed by :mod:`dsbd_jax.parallel.rules`, prompts split over ``data``, and the
KV caches take the layout they state where they are made, resolved under the mesh and rules
this class enters around its own trace only. Under many processes each passes its own prompts
and gets its own rows back; the global batch decodes exactly as one process would decode it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from dsbd_jax.decoding import common

from dsbd_jax.decoding._jit import calls, inputs, programs
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.fused import unfuse_projections
from dsbd_jax.models.kinds import unblock_params
from dsbd_jax.models.weights import Int8
from dsbd_jax.parallel import distributed
from dsbd_jax.parallel.mesh import mesh_label
from dsbd_jax.parallel.rules import (ShardingRules, model_configs, split_params, expand_kv_heads,
                                     param_shardings, shard_params)


def _leaf_bytes(x) -> int:
    return int(math.prod(x.shape) * np.dtype(x.dtype).itemsize)


UNEVEN_BATCH = ("pad", "replicate", "error")
GATHER = ("local", "all")


def share(prompt_ids, key, prompt_lengths):
    """This process's rows (``distributed.process_share``) of a whole batch: ``(ids [n, P],
    key (one key, or its rows of a batch of keys), lengths [n] or None)``."""
    ids = np.asarray(prompt_ids)
    rows = distributed.process_share(ids.shape[0]) if ids.ndim == 2 else slice(None)
    batch_keys = key is not None and np.ndim(key) == (1 if inputs.is_typed_key(key) else 2)
    return (ids[rows], key[rows] if batch_keys else key,
            None if prompt_lengths is None else np.asarray(prompt_lengths)[rows])


class ShardedDecoder:
    """A decoder (``sample``, ``beam_sample``, ``beam_search``, ``speculative_sample``,
    ``tree_speculative_sample``, ``dsbd_generate``) bound to its config and a mesh. It runs the
    decoder's own jitted core, the same jit object and compiler options a one-device call runs
    (:meth:`core_call`), on sharded arguments (params by the rules, prompts / lengths / keys
    over ``data``); the decode loop's state follows by XLA's sharding propagation. Same
    arguments and output as the decoder, same tokens as on one device for the same key. One
    compile per prompt bucket (``compiles`` counts them; they also count as the decoder's own,
    ``compile_count(name)``).

    ``takes_key=False`` for ``beam_search`` (default: from the function's name). Use
    :meth:`place` once for the parameters. ``strict``: :class:`ShardingRules`.

    ``uneven_batch``: what a batch that the data axis does not divide gets.
    ``"pad"`` (default) appends copies of the last prompt (same row key) up to a multiple of the
    data axis and drops them from the output: tokens, log-likelihoods, every per-prompt stat and
    the loop counts (``iterations``, ``target_calls``, ``draft_calls``) are those of the
    unpadded batch, but stats *summed over prompts* (DSBD's ``layer_*`` sums and the rates
    computed from them) include the copies. ``"replicate"`` runs that batch replicated over the
    data axis (every output identical to one device; the data shards do the same work).
    ``"error"`` raises a ``ValueError`` naming the batch size and the data axis.
    """

    def __init__(self, fn: Callable, config, mesh: Mesh, takes_key: Optional[bool] = None,
                 strict: bool = False, uneven_batch: str = "pad"):
        if uneven_batch not in UNEVEN_BATCH:
            raise ValueError(f"uneven_batch must be one of {UNEVEN_BATCH}, got {uneven_batch!r}")
        self.fn, self.mesh = fn, mesh
        self.uneven_batch = uneven_batch
        self.rules = ShardingRules(mesh, strict=strict)
        # KV heads that do not divide the model axis are repeated (exact; module doc)
        self.source_config = config
        self.kv_repeat = {k: self.rules.kv_repeat(mc) for k, mc in model_configs(config).items()}
        for k, r in self.kv_repeat.items():
            if r > 1:
                mc = model_configs(config)[k]
                self.rules.notes.append(
                    f"{k}: num_kv_heads = {mc.num_kv_heads} does not divide the model axis "
                    f"({self.rules.model_size}); each KV head is repeated {r}x (k_proj/v_proj and "
                    f"the KV cache hold {mc.num_kv_heads * r} heads, "
                    f"{mc.num_kv_heads * r // self.rules.model_size} per model shard; same results)")
        if isinstance(config, ModelConfig):
            self.config = config.replace(num_kv_heads=config.num_kv_heads * self.kv_repeat["target"])
        else:
            self.config = config.replace(**{
                k: mc.replace(num_kv_heads=mc.num_kv_heads * self.kv_repeat[k])
                for k, mc in model_configs(config).items()})
        name = getattr(fn, "__name__", "")
        self.takes_key = (name != "beam_search") if takes_key is None else takes_key
        self.name = name or "decoder"
        self.compiles = 0
        self._compiled: Dict[Any, Any] = {}
        self._batch_leaves: Dict[Any, Any] = {}
        # decide (and log / raise for) indivisible dimensions up front
        for k, mc in model_configs(self.config).items():
            self.rules.axis_map(mc, k)

    @classmethod
    def of(cls, decoder, mesh: Mesh, **kwargs) -> "ShardedDecoder":
        """From a ``methods.Decoder`` (what ``methods.build`` returns)."""
        return cls(decoder.fn, decoder.config, mesh, takes_key=decoder.takes_key, **kwargs)

    # -- placement ----------------------------------------------------------------------------
    def place(self, params):
        """The parameters placed on the mesh (``device_put`` with the rules' shardings), KV heads
        repeated first where ``kv_repeat`` says so. Typed kernels (transposed kernels, a head's
        rows: :mod:`dsbd_jax.models.kinds`, single-CPU forms) are put back to ``[in, out]``,
        the form the sharding rules split; int8 kernels (:class:`dsbd_jax.models.weights.Int8`)
        stay int8, their codes and scales split along the plain kernel's axes
        (:func:`dsbd_jax.models.axes.logical_axes`); fused projections (a GPU load's default,
        :mod:`dsbd_jax.models.fused`) are split back into the separate ones the rules name."""
        configs = model_configs(self.source_config)
        pair, trees = split_params(params, configs)
        trees = {k: unfuse_projections(unblock_params(t, keep=(Int8,)), configs[k])
                 for k, t in trees.items()}
        trees = {k: expand_kv_heads(t, configs[k], self.kv_repeat[k]) for k, t in trees.items()}
        return shard_params(trees if pair else trees["target"], self.config, self.rules)

    def placer(self, role: str = "target"):
        """``load_model(..., place=dec.placer("target"))``: each tensor straight onto this
        process's shards of the mesh as it is read (``ShardingRules.placer``); :meth:`place`
        then only repeats KV heads where needed and reshards nothing else."""
        return self.rules.placer(model_configs(self.source_config)[role], role)

    def _raw(self, params, ids, lengths, keys):
        if self.takes_key:
            return self.fn(params, ids, keys, self.config, prompt_lengths=lengths)
        return self.fn(params, ids, self.config, prompt_lengths=lengths)

    def core_call(self, params, ids, lengths, keys) -> calls.CoreCall:
        """The decoder's own checked call, placed: its ``prepare`` (the host checks, then its
        jitted core bound to the arguments) on the host's batch (numpy ``ids [Bp, P]``,
        ``lengths [Bp]``, raw ``keys [Bp, 2]``) and ``params`` on the mesh, with every other
        argument then put on the mesh (:meth:`_place_args`). What this class compiles and runs
        is that call: the very jit object and compiler options a one-device call uses, given
        sharded arguments."""
        prepare = getattr(self.fn, "prepare", None)
        if prepare is None:
            raise TypeError(f"{self.name} is not a decoder made with @decoding._jit.decoder")
        if self.takes_key:
            call = prepare(params, ids, keys, self.config, prompt_lengths=lengths)
        else:
            call = prepare(params, ids, self.config, prompt_lengths=lengths)
        return calls.CoreCall(call.via, (call.args[0],) + self._place_args(
            call.args[1:], ids.shape[0], self._split(ids)), call.kwargs)

    def _place_args(self, args: tuple, batch: int, split: bool) -> tuple:
        """The core's arguments after its parameters, on the mesh: arrays whose leading axis
        is the batch split over ``data`` (when ``split``), the rest (``beam_search``'s
        scalars) replicated; typed PRNG keys placed as their raw data, then wrapped again."""
        def put(x):
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                return x
            typed = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
            data = np.asarray(jax.random.key_data(x) if typed else x)
            by_batch = split and x.ndim >= 1 and x.shape[0] == batch
            placed = jax.device_put(data, self.rules.batch_sharding(data.ndim) if by_batch
                                    else self.rules.replicated())
            return jax.random.wrap_key_data(placed, impl=jax.random.key_impl(x)) if typed \
                else placed
        return tuple(jax.tree.map(put, args))

    def _lower(self, call: calls.CoreCall, split_batch: bool):
        """Lower the decoder's own core for ``call`` under the mesh, with the rules that
        resolve the caches' logical axes (``models.axes.CACHE``) entered for this trace only."""
        common.note_trace(f"sharded {self.name}", mesh=mesh_label(self.mesh))
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(
                self.rules.logical_rules(split_batch)):
            return call.lower()

    def _inputs(self, prompt_ids, key, prompt_lengths):
        """Host side: check, compute the [B] row keys, pad the batch to a multiple of the data
        axis with copies of the last row. Returns (ids, lengths, raw keys [Bp, 2], B)."""
        ids = np.asarray(prompt_ids)
        inputs.check_prompt_batch(ids, prompt_lengths, self.config.target.vocab_size)
        B, Pl = ids.shape
        lengths = np.asarray(common.prompt_lengths_or_full(ids, prompt_lengths))
        if self.takes_key:
            inputs.check_key(key, B)
            keys = np.asarray(jax.random.key_data(inputs.row_keys(key, B)))
        else:
            keys = np.zeros((B, 2), np.uint32)
        pad = (-B) % self.rules.data_size
        if pad and self.uneven_batch == "error":
            raise ValueError(f"batch of {B} prompts does not divide the data axis "
                             f"({self.rules.data_size}); use uneven_batch='pad' or 'replicate'")
        if pad and self.uneven_batch == "pad":
            ids = np.concatenate([ids, np.repeat(ids[-1:], pad, 0)])
            lengths = np.concatenate([lengths, np.repeat(lengths[-1:], pad, 0)])
            keys = np.concatenate([keys, np.repeat(keys[-1:], pad, 0)])
        return ids.astype(np.int32), lengths.astype(np.int32), keys.astype(np.uint32), B

    def _split(self, ids) -> bool:
        return ids.shape[0] % self.rules.data_size == 0

    def lower(self, params, prompt_ids, key=None, prompt_lengths=None):
        """``jax.stages.Lowered`` of the sharded program."""
        ids, lengths, keys, _ = self._inputs(prompt_ids, key if self.takes_key else None,
                                             prompt_lengths)
        call = self.core_call(self._placed(params), ids, lengths, keys)
        return self._lower(call, self._split(ids))

    def _executable(self, call: calls.CoreCall, split: bool):
        """The compiled program for this call's argument shapes (compiled once, ahead of time,
        and kept: the program that runs is the one :meth:`compiled` shows)."""
        sig = (jax.tree.structure(call.args), split,
               tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(call.args)))
        if sig not in self._compiled:
            self._compiled[sig] = self._lower(call, split).compile()
            self.compiles += 1
        return self._compiled[sig]

    def compiled(self, params, prompt_ids, key=None, prompt_lengths=None):
        """``jax.stages.Compiled`` of the program a call with these arguments runs (many
        processes: ``prompt_ids`` is the global batch, as with ``whole_batch=True``)
        (``.as_text()``: its HLO, for :func:`loop_collectives`; ``.memory_analysis()``)."""
        ids, lengths, keys, _ = self._inputs(prompt_ids, key if self.takes_key else None,
                                             prompt_lengths)
        call = self.core_call(self._placed(params), ids, lengths, keys)
        return self._executable(call, self._split(ids))

    def _placed(self, params):
        """``params`` on the mesh with the rules' shardings (a no-op for :meth:`place`'s output)."""
        return jax.device_put(params, param_shardings(params, self.config, self.rules))

    def __call__(self, params, prompt_ids, key=None, prompt_lengths=None, gather: str = "local",
                 whole_batch: bool = False):
        """Decode ``prompt_ids [B, P]`` (``prompt_lengths [B]``, ``key``: one key or ``[B]``).

        One process: the whole batch, same output as the decoder (``jax.Array`` leaves).
        Many processes (``jax.process_count() > 1``): ``prompt_ids`` are this process's own
        prompts (any count, 0 included, the same width ``P`` on every process); the global batch is
        every process's rows in process order, so row ``b`` of process ``p`` is global row
        ``sum(counts[:p]) + b`` and its key is that of the global row (one key: ``fold_in(key,
        global row)``), so a prompt decodes the same whichever process passes it. Returns numpy
        leaves: batch leaves hold this process's rows (``gather="local"``) or the whole batch
        (``gather="all"``); the others (loop counts, stats summed over prompts) are the whole
        batch's. Every process must call it with the same decoder and key (checked: a
        ``ValueError`` on every process, never a hang).

        ``whole_batch=True``: every process passes the same whole batch (as one process
        would); each decodes its share (``distributed.process_share``) and every process gets
        the whole batch back (what the command line does). One process: no effect."""
        if gather not in GATHER:
            raise ValueError(f"gather must be one of {GATHER}, got {gather!r}")
        if jax.process_count() > 1:
            if whole_batch:
                prompt_ids, key, prompt_lengths = share(prompt_ids, key, prompt_lengths)
                gather = "all"
            return self._call_processes(params, prompt_ids, key, prompt_lengths, gather)
        ids, lengths, keys, B = self._inputs(prompt_ids, key, prompt_lengths)
        out = self._run(params, ids, lengths, keys)
        if ids.shape[0] == B:
            return out
        rows = slice(0, B)
        flags = self._batch_flags(params, ids, out)
        return jax.tree.map(lambda x, f: x[rows] if f else x, out, flags)

    def _run(self, params, ids, lengths, keys):
        """The compiled program on the padded global batch (numpy ``ids [Bp, P]``, ``lengths
        [Bp]``, raw ``keys [Bp, 2]``)."""
        call = self.core_call(self._placed(params), ids, lengths, keys)
        _, args, kwargs = programs.static_split(call.core._fun, call.core._jit_kwargs,
                                                call.args, call.kwargs)
        return self._executable(call, self._split(ids))(*args, **kwargs)

    def _call_processes(self, params, prompt_ids, key, prompt_lengths, gather):
        """Many processes: this process's prompts in, its rows (or all rows) out as numpy. A
        collective that fails (a process died: its connections close) raises
        ``distributed.PeerFailure`` here."""
        try:
            ids, lengths, key, offsets = self._global_batch(prompt_ids, key, prompt_lengths)
            ids, lengths, keys, B = self._inputs(ids, key, lengths)
            out = self._run(params, ids, lengths, keys)
            flags = self._batch_flags(params, ids, out)
            out = distributed.fetch(out, self.rules.replicated())
        except jax.errors.JaxRuntimeError as e:
            raise distributed.PeerFailure(f"sharded {self.name}", e) from e
        p = jax.process_index()
        rows = slice(offsets[p], offsets[p + 1]) if gather == "local" else slice(0, B)
        return jax.tree.map(lambda x, f: x[rows] if f else x, out, flags)

    def _settings(self) -> int:
        """Checksum of what every process must agree on: decoder, config, mesh."""
        return distributed.fingerprint(self.name, self.takes_key, repr(self.source_config),
                                       mesh_label(self.mesh), self.uneven_batch)

    def _global_batch(self, prompt_ids, key, prompt_lengths):
        """Many processes: this process's ``prompt_ids [n, P]`` (``n`` may be 0) -> the global
        batch ``(ids [B, P], lengths [B], key (one key, or raw [B, 2]), offsets [N + 1])``, every
        process's rows in process order. Exchanges a header (checked by
        ``distributed.check_headers``, the same error on every process), then the rows."""
        error, n, P, kind, khash, own = None, 0, 0, 0, 0, None
        try:
            ids = np.asarray(prompt_ids)
            if ids.ndim == 2 and ids.shape[0] == 0:    # fewer prompts than processes
                lengths = np.zeros((0,), np.int32)
            else:
                inputs.check_prompt_batch(ids, prompt_lengths, self.config.target.vocab_size)
                lengths = np.asarray(common.prompt_lengths_or_full(ids, prompt_lengths))
            n, P = ids.shape
            kind, khash, own = distributed.key_parts(key, n) if self.takes_key else (0, 0, None)
        except (ValueError, TypeError) as e:     # raised on every process after the header
            error = e
        header = np.array([error is not None, n, P, kind, khash, self._settings()], np.int64)
        headers = distributed.allgather(header)
        distributed.check_headers(headers, error)
        counts = headers[:, 1].tolist()
        rows = distributed.pack_rows(ids, lengths, own, max(counts))
        glob = distributed.concat_rows(distributed.allgather(rows), counts)
        g_ids, g_lengths, g_keys = distributed.unpack_rows(glob, P)
        return g_ids, g_lengths, (g_keys if kind == 2 else key), distributed.row_offsets(counts)

    def _batch_flags(self, params, ids, out):
        """Which leaves of ``out`` (the output for the padded batch ``ids``) have the batch as
        leading axis: those whose leading axis also follows a batch one data shard larger
        (traced once per shape). A tree of bools like the output."""
        Bp, Pl = ids.shape
        sig = (jax.tree.structure(params), Bp, Pl)
        if sig not in self._batch_leaves:
            d = self.rules.data_size
            abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)

            def shapes(b):
                return jax.eval_shape(self._raw, abstract,
                                      jax.ShapeDtypeStruct((b, Pl), jnp.int32),
                                      jax.ShapeDtypeStruct((b,), jnp.int32),
                                      jax.ShapeDtypeStruct((b, 2), jnp.uint32))
            a, b = out, shapes(Bp + d)
            self._batch_leaves[sig] = jax.tree.map(
                lambda x, y: bool(x.shape) and x.shape[0] == Bp and y.shape[0] == Bp + d, a, b)
        return self._batch_leaves[sig]

    # -- figures ------------------------------------------------------------------------------
    def param_bytes_per_device(self, params) -> Dict[str, int]:
        """Bytes of the placed parameters on each device (by ``addressable_shards``)."""
        per: Dict[str, int] = {}
        for x in jax.tree.leaves(params):
            for s in x.addressable_shards:
                per[str(s.device)] = per.get(str(s.device), 0) + _leaf_bytes(s.data)
        return per


def sharded(fn: Callable, config, mesh: Mesh, **kwargs) -> ShardedDecoder:
    """Shorthand for :class:`ShardedDecoder`."""
    return ShardedDecoder(fn, config, mesh, **kwargs)
