"""Kernels per decoder iteration on a GPU, phase by phase, read off XLA's dump of the programs.

XLA:GPU turns a compiled program into a *thunk sequence*: one thunk per kernel launch, library
call (cuBLAS), copy, or control flow (``while``, ``conditional``). With ``XLA_FLAGS=
--xla_dump_to=DIR --xla_dump_hlo_as_text`` it writes, per program, the sequence
(``*.thunk_sequence.txt``, nested by loop), each thunk's HLO instruction
(``*.thunk_metadata.txt``) and the optimised HLO (``*_gpu_after_optimizations.txt``), whose
metadata names the ``jax.named_scope`` path each instruction was traced under.
``scripts/gpu_bench.sh`` sets those flags for the decoders' programs and runs this script.

For each decoder's core program (``jit__<method>_core``) this finds the decode loop (the top-level
``while`` with the most thunks) and counts what one iteration of it launches: every thunk of its
body once, its condition once, and each ``while`` nested in the body ``trip count`` times (its
body and condition; the trip count from the HLO's ``known_trip_count``; a nested loop without one
is listed under ``unknown_trips`` and counted once; of a ``conditional``, the branch with the most
thunks, the one that does the work). Each launch goes to the phase of its
instruction, by the rule of :func:`dsbd_jax.eval.profile.phase_of` (the CPU profile's phases:
``target forward``, ``draft forward``, ``warp``, ``random``, ``verify``, ``width``, ``cache``,
``other``). The draft head's passes (scope ``draft_head_d{hidden}``) count as ``draft forward``.

These are launches a program issues, counted statically from the program XLA built, not a
profiler's trace. By default XLA:GPU records the kernels between loops into command buffers
(CUDA graphs) and launches each buffer at once (``*.thunk_sequence_after_thunk_passes.txt``,
counted as ``command_buffers``), so the launches' CPU cost is mostly gone; each kernel still
runs on the GPU one after another, and a kernel of one block of threads still costs a few
microseconds: ``single_block`` counts those.

Usage: python benchmarks/gpu_kernels.py DUMP_DIR --machine-from results/gpu/DEVICE.json \
           --out results/gpu/DEVICE_kernels.json
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
from typing import Dict, List, Optional, Tuple

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from dsbd_jax.eval.profile import instruction_scopes, phase_of  # noqa: E402

_ROW = re.compile(r"^(\s*)(\d+): (k\w+)\s+\[[^\]]*\]\s*(.*)$")
_GRID = re.compile(r"grid: \[(\d+), (\d+), (\d+)\]")
_TRIP = re.compile(r'^\s*%?(while[\w.\-]*) = .*known_trip_count":\{"n":"(\d+)"')
_FORWARD = re.compile(r"forward_L(\d+)_d(\d+)")
_HEAD = re.compile(r"draft_head_d\d+")
_CORE = re.compile(r"^module_\d+\.jit__(\w+?)_core$")
# thunks that only hold others
_CONTAINERS = {"kWhile", "kConditional", "kSequential", "kCommandBuffer"}


class Thunk:
    def __init__(self, indent: int, tid: Optional[int], kind: str, rest: str):
        self.indent, self.tid, self.kind, self.rest = indent, tid, kind, rest
        self.sections: Dict[str, List["Thunk"]] = {}

    @property
    def blocks(self) -> Optional[int]:
        g = _GRID.search(self.rest)
        return int(g.group(1)) * int(g.group(2)) * int(g.group(3)) if g else None


def parse_sequence(text: str) -> List[Thunk]:
    """The top-level thunks of a ``*.thunk_sequence.txt``, loops holding their ``condition`` and
    ``body`` thunks. A thunk's indentation says which open section it belongs to; a section
    line (``condition:``, ``body:``) opens a section of the loop just before it, or of the
    innermost loop whose section is open (XLA prints the first one unindented)."""
    top: List[Thunk] = []
    # open sections, innermost last: (the loop, its section's thunk list, their indentation)
    stack: List[Tuple[Optional[Thunk], List[Thunk], Optional[int]]] = [(None, top, 0)]
    last: Optional[Thunk] = None
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            indent = len(m.group(1))
            while len(stack) > 1 and stack[-1][2] is not None and indent < stack[-1][2]:
                stack.pop()
            owner, thunks, at = stack[-1]
            if at is None:
                stack[-1] = (owner, thunks, indent)
            t = Thunk(indent, int(m.group(2)), m.group(3), m.group(4))
            thunks.append(t)
            last = t
            continue
        section = line.strip().rstrip(":")
        if not line.strip().endswith(":") or not (section in ("condition", "body")
                                                   or "branch" in section):
            continue
        kind = "kWhile" if section in ("condition", "body") else "kConditional"
        if last is not None and last.kind == kind and not last.sections:
            owner = last
        else:   # the innermost open loop (or conditional) that lacks this section
            owner = next((o for o, _, _ in reversed(stack)
                          if o is not None and o.kind == kind and section not in o.sections), None)
        if owner is None:
            raise ValueError(f"a {section!r} section with no loop before it: {line!r}")
        # close the owner's open section and every section opened inside it
        while len(stack) > 1 and any(o is owner for o, _, _ in stack):
            stack.pop()
        owner.sections[section] = []
        stack.append((owner, owner.sections[section], None))
        last = None
    return top


def parse_annotations(text: str) -> Dict[int, str]:
    """``{thunk id: its HLO instruction}`` from a ``*.thunk_metadata.txt``."""
    out, current = {}, None
    for line in text.splitlines():
        a = re.search(r'profile_annotation: "([^"]*)"', line)
        if a:
            current = a.group(1)
            continue
        i = re.search(r"thunk_id: (\d+)", line)
        if i and current is not None:
            out[int(i.group(1))] = current
            current = None
        elif "thunk_metadata {" in line:
            current = None
    return out


def _inner(t: Thunk) -> List[Thunk]:
    return [x for s in t.sections.values() for x in s]


def count_thunks(thunks: List[Thunk]) -> int:
    return sum(count_thunks(_inner(t)) if t.sections else (t.kind not in _CONTAINERS)
               for t in thunks)


def iteration_launches(loop: Thunk, names: Dict[int, str], trips: Dict[str, int],
                       unknown: List[str], counted=lambda t: t.kind not in _CONTAINERS):
    """``[(thunk, times per iteration)]`` for every thunk of one trip of ``loop`` that
    ``counted`` accepts (by default those that launch: no container)."""
    out = []

    def walk(thunks, times):
        for t in thunks:
            if t.kind == "kWhile":
                name = names.get(t.tid, f"thunk {t.tid}")
                n = trips.get(name)
                if n is None:
                    unknown.append(name)
                    n = 1
                for s in t.sections.values():
                    walk(s, times * n)
            elif t.sections:   # a conditional: its largest branch (the one that does the work)
                walk(max(t.sections.values(), key=count_thunks), times)
            elif counted(t):
                out.append((t, times))

    walk(loop.sections.get("body", []), 1)
    walk(loop.sections.get("condition", []), 1)
    return out


def module_counts(base: str) -> Optional[dict]:
    """Kernels per iteration of one decoder program's decode loop (module doc)."""
    seq = parse_sequence(open(base + ".thunk_sequence.txt").read())
    names = parse_annotations(open(base + ".thunk_metadata.txt").read())
    hlo_files = glob.glob(base + ".sm_*_gpu_after_optimizations.txt") or glob.glob(
        base + "*after_optimizations.txt")
    if not hlo_files:
        return None
    hlo = open(hlo_files[0]).read()
    trips = {m.group(1): int(m.group(2)) for m in map(_TRIP.match, hlo.splitlines()) if m}
    scopes = instruction_scopes(hlo)
    loops = [t for t in seq if t.kind == "kWhile"]
    if not loops:
        return None
    loop = max(loops, key=lambda t: count_thunks(_inner(t)))
    forwards = sorted({m.groups() for m in _FORWARD.finditer(hlo)},
                      key=lambda ld: int(ld[0]) * int(ld[1]) ** 2, reverse=True)
    target = f"forward_L{forwards[0][0]}_d{forwards[0][1]}" if forwards else None
    head = _HEAD.search(hlo)
    draft = (f"forward_L{forwards[1][0]}_d{forwards[1][1]}" if len(forwards) > 1
             else (head.group(0) if head else None))
    unknown: List[str] = []
    launches = iteration_launches(loop, names, trips, unknown)
    by_phase, single, kinds = collections.Counter(), collections.Counter(), collections.Counter()
    for t, n in launches:
        instr = names.get(t.tid, "")
        phase = phase_of(scopes.get(instr, ("", ""))[1], target, draft)
        by_phase[phase] += n
        kinds[t.kind] += n
        if t.blocks == 1:
            single[phase] += n
    passes = by_phase["target forward"] + by_phase["draft forward"]
    total = sum(by_phase.values())
    after = base + ".thunk_sequence_after_thunk_passes.txt"
    buffers = None
    if os.path.exists(after):
        # command buffers per iteration: the same loop (the same thunk id) after XLA's passes
        aloop = next((t for t in parse_sequence(open(after).read()) if t.tid == loop.tid), None)
        if aloop is not None:
            buffers = sum(n for _, n in iteration_launches(
                aloop, names, trips, [], counted=lambda t: t.kind == "kCommandBuffer"))
    return {
        "decode_loop": names.get(loop.tid, f"thunk {loop.tid}"),
        "target_scope": target, "draft_scope": draft,
        "launches_per_iteration": total,
        "in_passes": passes, "outside_passes": total - passes,
        "by_phase": dict(by_phase), "single_block_by_phase": dict(single),
        "single_block_outside_passes": sum(v for k, v in single.items()
                                           if k not in ("target forward", "draft forward")),
        "by_thunk_kind": dict(kinds),
        "nested_loop_trips": {k: v for k, v in trips.items() if k != names.get(loop.tid)},
        "unknown_trips": sorted(set(unknown)),
        "command_buffers_per_iteration": buffers,
    }


def decoder_modules(dump_dir: str) -> Dict[str, List[str]]:
    """``{method: [module base path, ...]}`` for the decoders' core programs in a dump."""
    out = collections.defaultdict(list)
    paths = glob.glob(os.path.join(dump_dir, "module_*.thunk_sequence.txt"))
    for path in sorted(paths, key=lambda p: int(os.path.basename(p).split(".")[0][7:])):
        base = path[:-len(".thunk_sequence.txt")]
        m = _CORE.match(os.path.basename(base))
        if m:
            out[m.group(1)].append(base)
    return dict(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dump_dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--machine-from", required=True,
                    help="the accelerator.py JSON of the same run: its machine block is copied")
    ap.add_argument("--label", action="append", default=[],
                    help="METHOD=LABEL,LABEL,...: names for a method's programs in dump order")
    args = ap.parse_args(argv)
    labels = {k: v.split(",") for k, v in (s.split("=", 1) for s in args.label)}
    programs = {}
    for method, bases in decoder_modules(args.dump_dir).items():
        for i, base in enumerate(bases):
            c = module_counts(base)
            if c is None:
                continue
            given = labels.get(method, [])
            name = given[i] if i < len(given) else (
                f"{method} ({c['draft_scope']})" if c["draft_scope"] else method)
            c["module"] = os.path.basename(base)
            # the same decoder again (accelerator.py --projections separate fused): "[2]", ...
            first, k = name, 1
            while name in programs:
                k += 1
                name = f"{first} [{k}]"
            programs[name] = c
            print(f"{name:40s} {c['launches_per_iteration']:5d} launches per iteration, "
                  f"{c['outside_passes']:5d} outside the passes "
                  f"({c['single_block_outside_passes']} of one block)", flush=True)
    if not programs:
        raise SystemExit(f"no decoder programs (module_*.jit__*_core.thunk_sequence.txt) in "
                         f"{args.dump_dir}: was XLA_FLAGS=--xla_dump_to set for the run?")
    beam = next((c for k, c in programs.items() if k.startswith("beam_sample")), None)
    if beam:
        for c in programs.values():
            c["outside_vs_beam_sample"] = c["outside_passes"] / max(beam["outside_passes"], 1)
    with open(args.machine_from) as f:
        source = json.load(f)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": source["machine"],
                   "source": "XLA thunk sequences (static count per decode-loop iteration)",
                   "programs": programs}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
