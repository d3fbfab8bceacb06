"""What a decoder's program holds for a platform this machine may not have.

:func:`lowered_text` lowers the call the public decoder would make for ``platform`` (``"cuda"``
without a GPU, or any platform jax lowers for) as HLO text with each instruction's scope;
``params`` may be abstract (:func:`abstract_params`), so a model of any size needs no weights.
Nothing is compiled or run. :func:`static_counts` counts, per iteration of the decode loop and
per phase of :mod:`dsbd_jax.eval.profile`, the operations of that program (XLA's input, before
its passes: not the kernels a GPU launches), those with a vocabulary-sized axis, and the inner
loops with their trip counts. What is counted and why: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import collections
import re
from typing import Any, Dict, Optional

import jax

from dsbd_jax.eval.profile import (PASSES, PHASES, _CONTAINERS, _INSTR, _OPNAME, _header,
                                   loop_conditions, members_of, phase_of, program_structure)

_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}
_EDGE = re.compile(r"\b(to_apply|calls|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_CONSTANT = re.compile(r"\bconstant\((-?\d+)\)")
_COMPARE_LT = re.compile(r"\bcompare\(.*direction=LT")


def abstract_params(config, layout: Optional[str] = None):
    """A model's parameter tree as ``jax.ShapeDtypeStruct`` leaves (``models.llama.init_params``
    traced, nothing allocated): enough to lower a decoder at a model's real shapes."""
    from dsbd_jax.models.llama import init_params
    return jax.eval_shape(lambda k: init_params(config, k, layout), jax.random.key(0))


def lowered_text(decoder, params, prompt_ids, key, prompt_lengths=None,
                 platform: str = "cuda") -> str:
    """The HLO text, with scopes, of the program a call of ``decoder`` with these arguments runs,
    lowered for ``platform`` (module doc). ``params`` may be abstract."""
    call = decoder.core_call(params, prompt_ids, key, prompt_lengths)
    core = call.core
    if hasattr(core, "for_call"):   # the host's compiler options do not change the lowering
        core = core.for_call(call.args, call.kwargs, None)[0]
    lowered = core.trace(*call.args, **call.kwargs).lower(lowering_platforms=(platform,))
    return lowered.as_text(dialect="hlo", debug_info=True)


def _lines_of(hlo_text: str) -> Dict[str, list]:
    """``{computation: its instruction lines}``."""
    out, current = collections.defaultdict(list), None
    for line in hlo_text.splitlines():
        head = None if _INSTR.match(line) else _header(line)
        if head:
            current = head
        elif current is not None:
            out[current].append(line)
    return out


def _trips(lines) -> Optional[int]:
    """A ``scan``-like loop's trip count from its condition computation's ``lines``: the one
    integer constant its ``counter < constant`` compares with; ``None`` when the condition is
    not of that form (a ``while_loop`` that stops on data)."""
    consts = [int(c) for line in lines for c in _CONSTANT.findall(line) if "s32[]" in line]
    if len(consts) == 1 and any(_COMPARE_LT.search(line) for line in lines):
        return consts[0]
    return None


def _own_scopes(hlo_text: str) -> Dict[str, Any]:
    """``{instruction: (opcode, its own op_name or "")}``: in a program before XLA's passes an
    instruction of a called computation names its scope within that computation only."""
    out = {}
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if m:
            op = _OPNAME.search(line)
            out[m.group(1)] = (m.group(2), op.group(1) if op else "")
    return out


def static_counts(hlo_text: str, target_scope: str, draft_scope: Optional[str] = None,
                  vocab_size: Optional[int] = None, branches: str = "all") -> Dict[str, Any]:
    """Operations per iteration of the decode loop of a lowered program (module doc):
    ``ops`` and ``vocab_ops`` per phase, ``ops_outside_passes``, ``loops`` (the loops inside the
    iteration: ``while``, ``phase``, ``trips`` or ``None``, ``runs_per_iteration``: trips times
    the runs of the loop around it), ``loop_trips`` (the fixed trips per iteration, summed, of
    the loops with more than one: XLA's passes replace a one-trip loop by its body) and
    ``unknown_trips`` (loops whose trips the program does not fix, each counted once).
    ``branches``: a ``conditional``'s branches all count (``"all"``), or its first only
    (``"first"``: ``lax.cond``'s false branch, e.g. DSBD's verification on the tops when no
    equal entries reach past them, ``dsbd.iteration``)."""
    if branches not in ("all", "first"):
        raise ValueError(f"branches must be 'all' or 'first', got {branches!r}")
    scopes = _own_scopes(hlo_text)
    comp_of, bodies, types, entry = program_structure(hlo_text)
    conditions, members = loop_conditions(hlo_text), members_of(comp_of)
    lines = _lines_of(hlo_text)
    callees = collections.defaultdict(list)
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if m and (m.group(2) in ("call", "conditional", "fusion")):
            for what, target in _EDGE.findall(line):
                callees[m.group(1)].extend(t.strip().lstrip("%") for t in
                                           target.strip("{}").split(",") if t.strip())
            if m.group(2) == "conditional" and branches == "first":
                callees[m.group(1)] = callees[m.group(1)][:1]
    vocab_dim = re.compile(rf"[\[,]{int(vocab_size)}[\],]") if vocab_size else None

    def visit(comp: str, times: int, prefix: str, tally, loops: list, seen=()):
        """Count ``comp``'s operations, run ``times`` times; an instruction's scope is its
        ``op_name`` under ``prefix``, the scope of the ``call`` that reached ``comp`` (the
        names inside a called computation are its own)."""
        if comp in seen:
            return
        seen = seen + (comp,)
        for name in members.get(comp, ()):
            opcode, own = scopes.get(name, ("", ""))
            path = f"{prefix}/{own}" if prefix and own else (own or prefix)
            phase = phase_of(path, target_scope, draft_scope)
            if name in bodies:          # a loop inside: its body runs trips times per run
                n = _trips(lines.get(conditions.get(name), ()))
                loops.append({"while": name, "trips": n, "phase": phase,
                              "runs_per_iteration": times * n if n is not None else None})
                visit(bodies[name], times * (n if n is not None else 1), prefix, tally, loops,
                      seen)
                if name in conditions:
                    visit(conditions[name], times * ((n or 0) + 1), prefix, tally, [], seen)
            elif name in callees:       # call / conditional (every branch counts) / fusion
                for callee in callees[name]:
                    visit(callee, times, path, tally, loops, seen)
            elif opcode not in _FREE and opcode not in _CONTAINERS:
                tally[0][phase] += times
                if vocab_dim is not None and vocab_dim.search(types.get(name, "")):
                    tally[1][phase] += times

    def iteration(w: str):
        tally, loops = (collections.Counter(), collections.Counter()), []
        visit(bodies[w], 1, "", tally, loops)
        if w in conditions:
            visit(conditions[w], 1, "", tally, [])
        return tally, loops

    entry_loops = [w for w in bodies if comp_of.get(w) == entry]
    if not entry_loops:
        raise ValueError("the program's entry computation has no loop: no decode loop to count")
    decode = max(entry_loops, key=lambda w: sum(iteration(w)[0][0].values()))
    (ops, vocab), loops = iteration(decode)
    return {"decode_loop": decode,
            "ops": {p: ops.get(p, 0) for p in PHASES if p != "prefill"},
            "ops_outside_passes": sum(n for p, n in ops.items() if p not in PASSES),
            "vocab_ops": {p: vocab.get(p, 0) for p in PHASES if p != "prefill"},
            "vocab_ops_outside_passes": sum(n for p, n in vocab.items() if p not in PASSES),
            "loops": loops,
            "loop_trips": sum(lp["runs_per_iteration"] or 0 for lp in loops if lp["trips"] != 1),
            "unknown_trips": sum(lp["trips"] is None for lp in loops)}
