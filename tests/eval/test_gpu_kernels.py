"""benchmarks/gpu_kernels.py: kernel launches per decoder iteration from an XLA:GPU dump.

The dump is written here by hand in the formats XLA:GPU writes (as dumped by jax 0.11.2 on an
H200): a thunk sequence with a nested loop and a conditional (the first section line of a loop
unindented, as XLA prints it), the thunks' instructions, and the optimised HLO with scopes and a
known trip count. Every count below follows from the rules of the script's docstring.
"""

import json

import pytest

from bench_setup import load_bench

SEQUENCE = """\
000: kCustomKernel   [source         | next=001 (1) ] fusion_0 grid: [4, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
001: kWhile          [prev=000 (1)   | next=015 (1)]   
condition:
    002: kCustomKernel [source | sink] wrapped_not grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    003: kCustomKernel [source          | next=004 (1)   ] fusion_1 grid: [64, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
    004: kCublasLtMatmul [prev=003 (1)    | next=005 (1)   ] kCublasLtMatmul
    005: kCustomKernel [prev=004 (1)    | next=006 (1)   ] fusion_2 grid: [1, 1, 1] threads: [32, 1, 1]  shared_memory: 0 bytes
    006: kWhile        [prev=005 (1)   | next=010 (1)  ]       
condition:
        007: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
      body:
        008: kCustomKernel [source         | next=009 (1) ] fusion_3 grid: [1, 1, 1] threads: [192, 1, 1]  shared_memory: 0 bytes
        009: kCustomKernel [prev=008 (1)  | sink ] fusion_4 grid: [2, 1, 1] threads: [512, 1, 1]  shared_memory: 0 bytes
    010: kConditional  [prev=006 (1) | next=014 (2) ]       
      false_branch:
        011: kCustomKernel [source         | next=012 (1)] fusion_5 grid: [1, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
        012: kCustomKernel [prev=011 (1)   | sink] fusion_6 grid: [8, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
      true_branch:
        013: kCopy         [source | sink] kCopy
    014: kCustomKernel [prev=010 (1)  | sink ] fusion_7 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
015: kCustomKernel   [prev=001 (1)  | sink ] fusion_8 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
"""

# thunk id -> (instruction, kind)
THUNKS = {0: ("fusion.0", "kCustomKernel"), 1: ("while.1", "kWhile"),
          2: ("wrapped_not", "kCustomKernel"), 3: ("fusion.1", "kCustomKernel"),
          4: ("custom-call.1", "kCublasLtMatmul"), 5: ("fusion.2", "kCustomKernel"),
          6: ("while.2", "kWhile"), 7: ("loop_compare_fusion", "kCustomKernel"),
          8: ("fusion.3", "kCustomKernel"), 9: ("fusion.4", "kCustomKernel"),
          10: ("conditional.1", "kConditional"), 11: ("fusion.5", "kCustomKernel"),
          12: ("fusion.6", "kCustomKernel"), 13: ("copy.1", "kCopy"),
          14: ("fusion.7", "kCustomKernel"), 15: ("fusion.8", "kCustomKernel")}

BODY = "jit(_dsbd_core)/while/body"
SCOPES = {  # instruction -> op_name
    "fusion.0": "jit(_dsbd_core)/prefill/forward_L28_d1536/add",
    "wrapped_not": f"{BODY}/not",
    "fusion.1": f"{BODY}/forward_L28_d1536/LlamaForCausalLM/attn/q_proj/dot_general",
    "custom-call.1": f"{BODY}/forward_L24_d896/LlamaForCausalLM/mlp/dot_general",
    "fusion.2": f"{BODY}/vmap(verify)/select",
    "loop_compare_fusion": f"{BODY}/while/cond/lt",
    "fusion.3": f"{BODY}/vmap(verify)/while/body/reduce_sum",
    "fusion.4": f"{BODY}/warp/sort",
    "fusion.5": f"{BODY}/vmap(random)/threefry2x32",
    "fusion.6": f"{BODY}/random/bits",
    "copy.1": f"{BODY}/copy",
    "fusion.7": f"{BODY}/add",
    "fusion.8": "jit(_dsbd_core)/select",
}


def write_dump(d, module="module_0042.jit__dsbd_core", trip=3):
    (d / f"{module}.thunk_sequence.txt").write_text(SEQUENCE)
    meta = "".join(
        f'thunk_metadata {{\n  thunk_info {{\n    profile_annotation: "{name}"\n'
        f"    thunk_id: {i}\n  }}\n  thunk_kind: \"{kind}\"\n}}\n"
        for i, (name, kind) in THUNKS.items())
    (d / f"{module}.thunk_metadata.txt").write_text(
        'thunk_metadata {\n  thunk_info {\n    profile_annotation: "command_buffer_1"\n  }\n'
        '  thunk_kind: "kCommandBuffer"\n}\n' + meta)
    lines = ["HloModule jit__dsbd_core, is_scheduled=true", "",
             "ENTRY %main.1 (p: f32[4]) -> f32[4] {"]
    for name, op in SCOPES.items():
        opcode = {"custom-call.1": "custom-call", "copy.1": "copy"}.get(name, "fusion")
        lines.append(f'  %{name} = f32[4]{{0}} {opcode}(%p), kind=kLoop, '
                     f'metadata={{op_name="{op}"}}')
    lines.append('  %while.1 = (s32[]) while(%t), condition=%c1, body=%b1, '
                 'metadata={op_name="jit(_dsbd_core)/while"}')
    lines.append(f'  %while.2 = (s32[]) while(%t), condition=%c2, body=%b2, '
                 f'metadata={{op_name="{BODY}/while"}}, '
                 f'backend_config={{"known_trip_count":{{"n":"{trip}"}}}}')
    lines.append("}")
    (d / f"{module}.sm_9.0a_gpu_after_optimizations.txt").write_text("\n".join(lines) + "\n")


def test_parse_nests_loops_and_branches():
    gk = load_bench("gpu_kernels")
    top = gk.parse_sequence(SEQUENCE)
    assert [t.tid for t in top] == [0, 1, 15]
    loop = top[1]
    assert sorted(loop.sections) == ["body", "condition"]
    assert [t.tid for t in loop.sections["condition"]] == [2]
    assert [t.tid for t in loop.sections["body"]] == [3, 4, 5, 6, 10, 14]
    inner, cond = loop.sections["body"][3], loop.sections["body"][4]
    assert [t.tid for t in inner.sections["condition"]] == [7]
    assert [t.tid for t in inner.sections["body"]] == [8, 9]
    assert {k: [t.tid for t in v] for k, v in cond.sections.items()} == {
        "false_branch": [11, 12], "true_branch": [13]}


def test_counts_per_iteration_by_phase(tmp_path):
    gk = load_bench("gpu_kernels")
    write_dump(tmp_path)
    c = gk.module_counts(str(tmp_path / "module_0042.jit__dsbd_core"))
    assert c["decode_loop"] == "while.1"
    assert (c["target_scope"], c["draft_scope"]) == ("forward_L28_d1536", "forward_L24_d896")
    # body once; the nested loop's condition and body 3 times; the conditional's larger branch;
    # the loop's own condition once; nothing before or after the loop
    assert c["by_phase"] == {"target forward": 1, "draft forward": 1, "verify": 1 + 3,
                             "warp": 3, "random": 2, "other": 3 + 1 + 1}
    assert c["launches_per_iteration"] == 16
    assert (c["in_passes"], c["outside_passes"]) == (2, 14)
    # one-block kernels outside the passes: 002, 005, 007 x3, 008 x3, 011, 014
    assert c["single_block_outside_passes"] == 10
    assert c["by_thunk_kind"] == {"kCustomKernel": 15, "kCublasLtMatmul": 1}
    assert c["nested_loop_trips"] == {"while.2": 3} and c["unknown_trips"] == []


def test_trip_count_scales_the_nested_loop(tmp_path):
    gk = load_bench("gpu_kernels")
    write_dump(tmp_path, trip=5)
    c = gk.module_counts(str(tmp_path / "module_0042.jit__dsbd_core"))
    assert c["launches_per_iteration"] == 16 + 2 * 3   # 3 launches a trip, 2 more trips


def test_main_writes_json_with_the_machine_block(tmp_path):
    gk = load_bench("gpu_kernels")
    write_dump(tmp_path)
    machine = {"device": "NVIDIA H200", "cpu_model": "x", "cpu_flags": [], "cpu_count": 1,
               "jax": "0", "jaxlib": "0", "xla_flags": ""}
    src = tmp_path / "acc.json"
    src.write_text(json.dumps({"machine": machine}))
    out = tmp_path / "k.json"
    gk.main([str(tmp_path), "--machine-from", str(src), "--out", str(out),
             "--label", "dsbd=dsbd_g2"])
    got = json.loads(out.read_text())
    assert got["machine"] == machine
    assert got["programs"]["dsbd_g2"]["launches_per_iteration"] == 16


def test_no_decoder_programs_is_an_error(tmp_path):
    gk = load_bench("gpu_kernels")
    src = tmp_path / "acc.json"
    src.write_text(json.dumps({"machine": {}}))
    with pytest.raises(SystemExit, match="xla_dump_to"):
        gk.main([str(tmp_path), "--machine-from", str(src), "--out", str(tmp_path / "k.json")])


def test_a_loop_body_after_a_conditional_in_its_condition_goes_to_the_loop():
    gk = load_bench("gpu_kernels")
    text = """\
001: kWhile          [source | sink]
condition:
    002: kConditional  [source | next=005 (1) ]
      true_branch:
        003: kCustomKernel [source | sink] fusion_1 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
      false_branch:
        004: kCustomKernel [source | sink] fusion_2 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
    005: kCustomKernel [prev=002 (1) | sink] fusion_3 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    006: kCustomKernel [source | sink] fusion_4 grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
"""
    (loop,) = gk.parse_sequence(text)
    assert [t.tid for t in loop.sections["condition"]] == [2, 5]
    assert [t.tid for t in loop.sections["body"]] == [6]
    assert sorted(loop.sections["condition"][0].sections) == ["false_branch", "true_branch"]
