"""Where a decoder's time goes: a profile of the real compiled decode loop, phase by phase.

:func:`profile_decoder` compiles the decoder's core once, runs it untimed, then once under
``jax.profiler`` tracing; each executed thunk's time goes to the innermost scope of
:data:`PHASES` its HLO instruction was traced under (``prefill`` wins over everything inside
it; ``while`` / ``conditional`` / ``call`` thunks contain others and are not counted).
:func:`executed_counts` gives what ran (thunks per phase, the vocabulary-sized ones, loop
trips), counts that do not depend on the host's load. ``overhead_frac`` is the share of the
decode loop's thunk time outside the forward passes (thunks run on both cores at once, so it is
a share of thunk time, not of wall time). The phases and their scopes:
``docs/results/design_notes.md``.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import shutil
import tempfile
import time
from typing import Any, Dict, Optional

import jax

PHASES = ("prefill", "target forward", "draft forward", "warp", "log-softmax", "random", "verify",
          "width", "cache", "other")
_SCOPES = {"warp": "warp", "random": "random", "verify": "verify", "width": "width",
           "cache": "cache", "log_softmax": "log-softmax"}
_CONTAINERS = {"while", "conditional", "call"}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\(")
_WRAPPED = re.compile(r"^(?:vmap|jit|pjit|checkpoint|remat)\((.*)\)$")
_OPNAME = re.compile(r'op_name="([^"]*)"')


_OPERAND = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"(?:calls|to_apply)=%?([\w.\-]+)")
_HEADER_NAME = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)")


def _header(line: str) -> Optional[str]:
    """The computation a line opens, if it is a header: an unindented line that ends in ``{``
    (its parameter list may hold ``/*index=5*/`` comments, so it may hold ``=``)."""
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
        h = _HEADER_NAME.match(line)
        return h.group(1) if h else None
    return None


def instruction_scopes(hlo_text: str):
    """``{instruction: (opcode, op_name)}`` from a compiled module's text. An instruction without
    metadata of its own takes the ``op_name`` of the computation it calls (its root, else its
    first instruction with one); a fusion that contains a matmul takes the matmul's (XLA:CPU fuses
    e.g. the vocabulary projection with the log-softmax's max, which would otherwise get the
    projection's time). What still has none (a dot that an XLA pass rebuilt) takes the scope of
    its first operand that has one."""
    out, calls, comp_op, comp_dot, comp_root, operands = {}, {}, {}, {}, {}, {}
    current = None
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            current = _header(line) or current
            continue
        op = _OPNAME.search(line)
        name = m.group(1)
        out[name] = (m.group(2), op.group(1) if op else "")
        if op and current is not None:
            comp_op.setdefault(current, op.group(1))
            if m.group(2) in ("dot", "convolution"):
                comp_dot.setdefault(current, op.group(1))
            if line.lstrip().startswith("ROOT"):
                comp_root[current] = op.group(1)
        called = _CALLS.search(line)
        if called:
            calls[name] = called.group(1)
        args = line[m.end():].split(")", 1)[0]
        operands[name] = _OPERAND.findall(args)
    for name, (opcode, op_name) in out.items():
        c = calls.get(name)
        if c is None:
            continue
        if c in comp_dot:   # a fused matmul: its epilogue (e.g. a log-softmax max) is not the cost
            out[name] = (opcode, comp_dot[c])
        elif not op_name:
            out[name] = (opcode, comp_root.get(c) or comp_op.get(c, ""))
    for _ in range(3):  # still nothing (e.g. a dot rewritten by a pass): its operands' scope
        for name, (opcode, op_name) in out.items():
            if not op_name:
                known = [out[o][1] for o in operands.get(name, ()) if out.get(o, ("", ""))[1]]
                if known:
                    out[name] = (opcode, known[0])
    return out


def phase_of(op_name: str, target_scope: str, draft_scope: Optional[str]) -> str:
    """The phase of an instruction from its ``op_name`` scope path (module doc)."""
    parts = op_name.split("/")
    if "prefill" in parts:
        return "prefill"
    for part in reversed(parts):
        m = _WRAPPED.match(part)  # vmap(verify) / jit(log_softmax): the scope inside
        part = m.group(1) if m else part
        if part == target_scope:
            return "target forward"
        if draft_scope is not None and part == draft_scope:
            return "draft forward"
        if part in _SCOPES:
            return _SCOPES[part]
    return "other"


def _trace_events(trace_dir: str):
    files = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
    if not files:
        raise RuntimeError(f"the profiler wrote no trace under {trace_dir}")
    with gzip.open(files[0]) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


_WHILE_BODY = re.compile(r"\bbody=%?([\w.\-]+)")


def program_structure(hlo_text: str):
    """``(computation of each instruction, {while instruction: its body computation},
    {instruction: its result's type text}, the entry computation)`` from a compiled module's
    text. A computation's header is an unindented line that ends in ``{`` (its parameter list
    may hold ``/*index=5*/`` comments)."""
    comp_of, bodies, types, current, entry = {}, {}, {}, None, None
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            head = _header(line)
            if head:
                current = head
                if line.startswith("ENTRY"):
                    entry = current
            continue
        name = m.group(1)
        comp_of[name] = current
        rhs = line.split("=", 1)[1]
        types[name] = rhs[:rhs.find(m.group(2) + "(")]
        if m.group(2) == "while":
            b = _WHILE_BODY.search(line)
            if b:
                bodies[name] = b.group(1)
    return comp_of, bodies, types, entry


_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_CONDITION = re.compile(r"\bcondition=%?([\w.\-]+)")


def computation_calls(hlo_text: str) -> Dict[str, set]:
    """``{computation: the computations its instructions call}`` (fusions, ``while`` bodies and
    conditions, ``call``, reductions' ``to_apply``, ``conditional`` branches)."""
    graph, current = collections.defaultdict(set), None
    for line in hlo_text.splitlines():
        head = None if _INSTR.match(line) else _header(line)
        if head:
            current = head
            continue
        graph[current].update(_CALLED.findall(line))
        for branches in _BRANCHES.findall(line):
            graph[current].update(b.strip().lstrip("%") for b in branches.split(","))
    return graph


def _reachable(graph: Dict[str, set], starts) -> set:
    seen, stack = set(), list(starts)
    while stack:
        c = stack.pop()
        if c not in seen:
            seen.add(c)
            stack.extend(graph.get(c, ()))
    return seen


def loop_conditions(hlo_text: str) -> Dict[str, str]:
    """``{while instruction: its condition computation}``."""
    conditions = {}
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        c = _CONDITION.search(line) if m and m.group(2) == "while" else None
        if c:
            conditions[m.group(1)] = c.group(1)
    return conditions


def members_of(comp_of: Dict[str, str]) -> Dict[str, list]:
    """``{computation: its instructions}`` from :func:`program_structure`'s first mapping."""
    members = collections.defaultdict(list)
    for name, comp in comp_of.items():
        members[comp].append(name)
    return members


def executed_counts(hlo_text: str, events, target_scope: str, draft_scope: Optional[str] = None,
                    vocab_size: Optional[int] = None, scopes=None) -> Dict[str, Any]:
    """What one traced call executed (module doc): ``thunks`` and ``vocab_thunks`` per phase, and
    ``loops``: one entry per ``while`` that ran (``executions``, ``trips``, ``phase``,
    ``in_entry``: whether it sits in the entry computation, as a decode loop does; a loop of the
    entry computation also has ``thunks`` and ``vocab_thunks``: those executed inside it, its
    condition and body and what they call; and ``loops_inside``: the loops nested in it).
    ``scopes``: :func:`instruction_scopes` of ``hlo_text``, where the caller has it already."""
    scopes = instruction_scopes(hlo_text) if scopes is None else scopes
    comp_of, bodies, types, entry = program_structure(hlo_text)
    runs = collections.Counter(e["args"]["hlo_op"] for e in events
                               if e.get("ph") == "X" and e.get("args", {}).get("hlo_op"))
    vocab_dim = re.compile(rf"[\[,]{int(vocab_size)}[\],]") if vocab_size else None

    def count(within=None):
        thunks, vocab = collections.Counter(), collections.Counter()
        for name, n in runs.items():
            opcode, op_name = scopes.get(name, ("", ""))
            if opcode in _CONTAINERS or (within is not None and comp_of.get(name) not in within):
                continue
            phase = phase_of(op_name, target_scope, draft_scope)
            thunks[phase] += n
            if vocab_dim is not None and vocab_dim.search(types.get(name, "")):
                vocab[phase] += n
        return ({p: thunks.get(p, 0) for p in PHASES}, {p: vocab.get(p, 0) for p in PHASES})

    thunks, vocab = count()
    graph = computation_calls(hlo_text)
    conditions, members = loop_conditions(hlo_text), members_of(comp_of)
    loops = []
    for name, body in bodies.items():
        # a trip: one run of the body. The condition runs once more than the body per execution
        # of the loop, so its count decides where it was traced; a body's busiest instruction
        # is the fallback (some thunks, an XLA:CPU sort among them, leave two events a run)
        executions = runs.get(name, 0)
        cond_runs = max((runs.get(i, 0) for i in members.get(conditions.get(name), ())),
                        default=0)
        trips = (cond_runs - executions if cond_runs > executions else
                 max((runs.get(i, 0) for i in members.get(body, ())), default=0))
        if trips:
            loop = {"while": name, "executions": executions, "trips": trips,
                    "phase": phase_of(scopes.get(name, ("", ""))[1], target_scope, draft_scope),
                    "in_entry": comp_of.get(name) == entry}
            if loop["in_entry"]:
                inside = _reachable(graph, [body] + ([conditions[name]] if name in conditions
                                                     else []))
                loop["thunks"], loop["vocab_thunks"] = count(inside)
                loop["loops_inside"] = sorted(w for w in bodies if comp_of.get(w) in inside)
            loops.append(loop)
    return {"thunks": thunks, "vocab_thunks": vocab, "loops": loops}


def profile_compiled(compiled, args, target_scope: str, draft_scope: Optional[str] = None,
                     vocab_size: Optional[int] = None) -> Dict[str, Any]:
    """Profile one call of an AOT-compiled function (see module doc). ``args``: its arguments.
    ``counts``: :func:`executed_counts` of the traced call."""
    text = compiled.as_text()
    scopes = instruction_scopes(text)
    jax.block_until_ready(compiled(*args))                     # untimed warm-up
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    untraced = time.perf_counter() - t0
    trace_dir = tempfile.mkdtemp(prefix="dsbd_profile_")
    try:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        traced = time.perf_counter() - t0
        jax.profiler.stop_trace()
        events = _trace_events(trace_dir)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
    per_phase = collections.Counter()
    per_op = collections.Counter()
    unknown = 0.0
    for e in events:
        name = e.get("args", {}).get("hlo_op")
        if e.get("ph") != "X" or name is None:
            continue
        opcode, op_name = scopes.get(name, ("", ""))
        if opcode in _CONTAINERS:
            continue
        dur = e.get("dur", 0) * 1e-6
        if not opcode:
            unknown += dur
        phase = phase_of(op_name, target_scope, draft_scope)
        per_phase[phase] += dur
        per_op[(phase, name)] += dur
    phases = {p: per_phase.get(p, 0.0) for p in PHASES}
    decode = traced - phases["prefill"]
    forwards = phases["target forward"] + phases["draft forward"]
    loop_thunks = sum(per_phase.values()) - phases["prefill"]
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:12]
    return {"output": out, "untraced_s": untraced, "traced_s": traced, "phases_s": phases,
            "thunk_sum_s": sum(per_phase.values()), "decode_s": decode,
            "forward_s": forwards, "overhead_s": decode - forwards,
            "overhead_frac": (loop_thunks - forwards) / loop_thunks if loop_thunks > 0
            else float("nan"),
            "unmatched_s": unknown,
            "counts": executed_counts(text, events, target_scope, draft_scope, vocab_size,
                                      scopes),
            "top_ops": [{"phase": p, "op": n, "s": s} for (p, n), s in top]}


def profile_decoder(decoder, params, prompt_ids, key, prompt_lengths=None) -> Dict[str, Any]:
    """Compile and profile one decoder call (module doc). Adds ``compile_s``, ``iterations``,
    ``generated_tokens`` and per-iteration figures."""
    from dsbd_jax.models.llama import forward_scope
    # the core and arguments the public function runs (host checks included)
    call = decoder.core_call(params, prompt_ids, key, prompt_lengths)
    if set(call.kwargs) != {"config"}:
        raise ValueError(f"profiling expects a core with a static config only, got "
                         f"{sorted(call.kwargs)}")
    args = call.args
    t0 = time.perf_counter()
    compiled = call.compile()
    compile_s = time.perf_counter() - t0
    cfg = decoder.config
    draft = getattr(cfg, "draft", None) if decoder.needs_draft else None
    res = profile_compiled(compiled, args, forward_scope(cfg.target),
                           forward_scope(draft) if draft is not None else None,
                           cfg.target.vocab_size)
    out = res.pop("output")
    its = int(out.stats["iterations"])
    res["per_iteration_counts"] = per_iteration_counts(res["counts"], its)
    res.update(compile_s=compile_s, iterations=its,
               generated_tokens=int(out.stats["generated_tokens"].max()),
               per_iteration_ms={k: 1e3 * v / max(its, 1) for k, v in res["phases_s"].items()
                                 if k != "prefill"},
               decode_per_iteration_ms=1e3 * res["decode_s"] / max(its, 1))
    return res


PASSES = ("prefill", "target forward", "draft forward")


def per_iteration_counts(counts: Dict[str, Any], iterations: int) -> Dict[str, Any]:
    """A decode call's :func:`executed_counts` per loop iteration: thunks and vocabulary-axis
    thunks per phase and outside the forward passes, and the trips of the loops inside the
    iteration, in all and per phase. The decode loop is the loop of the entry computation that
    made ``iterations`` trips (of several, the one that ran the most); what ran inside it is
    counted (``counted``: ``"decode loop"``), so what runs once per call (the prefill, making
    the random numbers before the loop, the outputs) is left out. Without such a loop, the whole call but the prefill is counted
    (``"call"``), and the inner loops are every loop but the prefill's."""
    its = max(int(iterations), 1)
    # of the entry's loops with as many trips, the biggest (a random-bits kernel's loop before
    # the decode loop can make as many trips as the decode loop)
    decode = sorted((lp for lp in counts["loops"]
                     if lp["in_entry"] and lp["trips"] == iterations and "thunks" in lp),
                    key=lambda lp: -sum(lp["thunks"].values()))
    if decode:
        thunks, vocab = decode[0]["thunks"], decode[0]["vocab_thunks"]
        inner = [lp for lp in counts["loops"] if lp["while"] in decode[0]["loops_inside"]]
    else:
        thunks, vocab = counts["thunks"], counts["vocab_thunks"]
        inner = [lp for lp in counts["loops"] if lp["phase"] != "prefill"]
    by_phase = collections.Counter()
    for lp in inner:
        by_phase[lp["phase"]] += lp["trips"]
    out = {
        "counted": "decode loop" if decode else "call",
        "thunks": {p: n / its for p, n in thunks.items() if p != "prefill"},
        "thunks_outside_passes": sum(n for p, n in thunks.items() if p not in PASSES) / its,
        "vocab_thunks": {p: n / its for p, n in vocab.items() if p != "prefill"},
        "vocab_thunks_outside_passes": sum(n for p, n in vocab.items()
                                           if p not in PASSES) / its,
        "loop_trips": sum(lp["trips"] for lp in inner) / its,
        "loop_trips_by_phase": {p: n / its for p, n in sorted(by_phase.items())},
        "inner_loops": len(inner)}
    return out
