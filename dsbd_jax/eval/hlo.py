"""Reading a compiled program's HLO text: the collectives inside a decode loop and whether any of
them moves a weight matrix or a KV cache. Tests and benchmarks use this to check sharded
programs; the runtime (``dsbd_jax.parallel``) does not.

Communication: :func:`loop_collectives` reads the compiled program
(``.lower(...).compile().as_text()``) and lists every collective inside the decode loop with its
bytes; the tests check that no weight matrix and no whole KV cache is all-gathered there.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.sharding import Mesh

from dsbd_jax.parallel.mesh import mesh_shape
from dsbd_jax.models.axes import path_keys


COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
                "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_SHAPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"\b(?:body|condition|to_apply|calls|true_computation|false_computation|"
                    r"branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_WHILE = re.compile(r"\bwhile\(")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def shapes_in(text: str) -> List[Tuple[str, Tuple[int, ...]]]:
    """Every ``dtype[dims]`` array type in a piece of HLO text."""
    out = []
    for dt, dims in _SHAPE.findall(text):
        if dt in DTYPE_BYTES:
            out.append((dt, tuple(int(x) for x in dims.split(",") if x)))
    return out


def _nbytes(shapes) -> int:
    return int(sum(DTYPE_BYTES[dt] * math.prod(dims) for dt, dims in shapes))


def parse_hlo(text: str):
    """``{computation: [instruction lines]}`` and the name of the entry computation."""
    comps: Dict[str, List[str]] = {}
    entry, cur = None, None
    for line in text.splitlines():
        s = line.strip()
        if cur is None:
            m = _COMP.match(s)
            if m and "=" not in s.split("(")[0]:
                cur = m.group(2)
                comps[cur] = []
                if m.group(1):
                    entry = cur
            continue
        if s == "}":
            cur = None
            continue
        comps[cur].append(s)
    return comps, entry


def _callees(line: str) -> List[str]:
    out = []
    for group in _CALLS.findall(line):
        out += [c.strip().lstrip("%") for c in group.strip("{}").split(",") if c.strip()]
    return out


def _type_text(rhs: str) -> str:
    """The result type at the start of an instruction's right-hand side."""
    rhs = rhs.strip()
    if not rhs.startswith("("):
        return rhs.split(" ", 1)[0]
    depth = 0
    for j, ch in enumerate(rhs):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rhs[:j + 1]
    return rhs


def _instructions(comps) -> Dict[str, str]:
    """Instruction name -> its result type text, over the whole module."""
    types = {}
    for lines in comps.values():
        for line in lines:
            lhs, eq, rhs = line.partition(" = ")
            if eq:
                types[lhs.replace("ROOT", "").strip().lstrip("%")] = _type_text(rhs)
    return types


def _collective_op(line: str) -> Optional[str]:
    rhs = line.split("=", 1)[1] if "=" in line else line
    for op in COLLECTIVES:
        if re.search(rf"\s{re.escape(op)}(-start)?\(", " " + rhs.split(", replica_groups")[0]):
            return op
    return None


def _operand_text(line: str) -> str:
    """The text between the op's parentheses (operands with their types)."""
    rhs = line.split("=", 1)[1]
    i = rhs.index("(", rhs.index(next(op for op in COLLECTIVES if op in rhs)))
    depth, j = 0, i
    while j < len(rhs):
        depth += rhs[j] == "("
        depth -= rhs[j] == ")"
        if depth == 0:
            break
        j += 1
    return rhs[i + 1:j]


def _result_text(line: str) -> str:
    rhs = line.split("=", 1)[1].strip()
    op = next(op for op in COLLECTIVES if op in rhs)
    return rhs[:rhs.index(op)]


def loop_collectives(hlo_text: str) -> Dict[str, Any]:
    """Collectives inside the decode loop(s) of a compiled program.

    The decode loops are the ``while`` ops reached from the entry computation without passing
    through another ``while`` and without a known trip count (the layer scans of the prefills
    have one). Everything those loops' bodies and conditions call is searched; a collective in a
    nested loop with a known trip count (the layer scan of a forward pass) counts that many times
    per iteration. Returns ``{"ops": [{op, operand_shapes, result_shapes, bytes, count}],
    "bytes_per_iteration", "decode_loops", "loop_state_shapes"}`` (``bytes``: operand bytes on one
    device; ``loop_state_shapes``: the per-device array types the decode loops carry).
    """
    comps, entry = parse_hlo(hlo_text)
    types = _instructions(comps)

    def find_decode_loops(comp, seen):
        loops = []
        for line in comps.get(comp, []):
            callees = _callees(line)
            if _WHILE.search(line):
                if not _TRIP.search(line):
                    loops.append(line)
                continue  # do not look inside loops with a known trip count
            for c in callees:
                if c not in seen:
                    seen.add(c)
                    loops += find_decode_loops(c, seen)
        return loops

    loops = find_decode_loops(entry, {entry})
    ops: Dict[Tuple, Dict[str, Any]] = {}

    def walk(comp, mult, stack):
        for line in comps.get(comp, []):
            op = _collective_op(line)
            if op is not None and "=" in line:
                operands = []
                for name in re.findall(r"%([\w.\-]+)", _operand_text(line)):
                    operands += shapes_in(types.get(name, ""))
                if not operands:  # operands printed with their types
                    operands = shapes_in(_operand_text(line))
                result = shapes_in(_result_text(line))
                key = (op, tuple(operands), tuple(result))
                entry_ = ops.setdefault(key, dict(op=op, operand_shapes=operands,
                                                  result_shapes=result,
                                                  bytes=_nbytes(operands), count=0))
                entry_["count"] += mult
            inner = mult
            if _WHILE.search(line):
                trip = _TRIP.search(line)
                inner = mult * (int(trip.group(1)) if trip else 1)
            for c in _callees(line):
                if c in comps and c not in stack:
                    walk(c, inner, stack | {c})

    state_shapes = []
    for line in loops:
        for c in _callees(line):
            walk(c, 1, {c})
        state_shapes += shapes_in(line.split("while(")[0])
    op_list = sorted(ops.values(), key=lambda o: -o["bytes"] * o["count"])
    return dict(ops=op_list, decode_loops=len(loops), loop_state_shapes=state_shapes,
                bytes_per_iteration=int(sum(o["bytes"] * o["count"] for o in op_list)))


def _dims_key(shape) -> Tuple[int, ...]:
    return tuple(sorted(int(d) for d in shape if d != 1))


def forbidden_shapes(params, cache_shapes: Sequence[Tuple[int, ...]], mesh: Optional[Mesh] = None
                     ) -> Dict[Tuple[int, ...], str]:
    """What must never be communicated inside the decode loop, as sorted non-unit dims -> name:
    every weight matrix (whole and, for stacked leaves, one layer) and every KV cache (whole or
    one layer; its batch axis whole or one data shard's, its heads whole or one model shard's)."""
    out: Dict[Tuple[int, ...], str] = {}
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = "/".join(path_keys(path))
        stacked = "layers" in path_keys(path)
        if np.ndim(x) - stacked >= 2:  # matrices (a stack of norm vectors is not one)
            out[_dims_key(x.shape)] = name
            if stacked:
                out[_dims_key(x.shape[1:])] = name + " (one layer)"
    d, m = mesh_shape(mesh) if mesh is not None else (1, 1)
    for shape in cache_shapes:
        L, B, S, K, D = shape
        for b in ({B, B // d} if B % d == 0 else {B}):
            for k in ({K, K // m} if K % m == 0 else {K}):
                out[_dims_key((L, b, S, k, D))] = f"KV cache {tuple(shape)}"
                out[_dims_key((b, S, k, D))] = f"KV cache {tuple(shape)} (one layer)"
    return out


def gathered_weights_or_caches(report: Dict[str, Any], params, cache_shapes: Sequence[Tuple[int, ...]],
                               mesh: Optional[Mesh] = None) -> List[Dict[str, Any]]:
    """The decode-loop collectives (from :func:`loop_collectives`) whose result has the shape of a
    weight matrix or of a KV cache (:func:`forbidden_shapes`), each with ``"what"`` it matches.
    An empty list is what the tests require."""
    forbidden = forbidden_shapes(params, cache_shapes, mesh)
    bad = []
    for o in report["ops"]:
        for _, dims in o["result_shapes"] + o["operand_shapes"]:
            if _dims_key(dims) in forbidden:
                bad.append(dict(o, what=forbidden[_dims_key(dims)]))
                break
    return bad
