"""triton-fused's step kernel as the GPU will run it, checked on the CPU: compiled ahead of time
for sm_90a through Triton's own ptxas and read back with its nvdisasm (no GPU needed).

[64, 8w, tf32x3] faulted on the H100 and H200 loans (compute-sanitizer: an out-of-bounds 512-byte
__shared__ read at +0x7cc0). That offset is an HGMMA whose shared-memory descriptor ptxas 12.8
built from R1, the stack pointer, instead of the shared base in the PTX. A kernel reads R1 only
to load it, to move it by its frame and as a local-memory address; anything else is that fault."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is in the test extra: pip install -e .[test]")
ROOT = Path(__file__).resolve().parents[2]

# The step kernel compiled ahead of time for sm_90a as a launch specializes it (both children).
PRELUDE = r"""
import json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fasttrain.ladder import triton_fused as tf
sig = dict(x_ptr="*u8", y_ptr="*i64", order_ptr="*i64", w_ptr="*fp32", b_ptr="*fp32",
           z_in_ptr="*fp32", z_out_ptr="*fp32", stats_ptr="*fp32", cur="i32", n_cur="i32",
           nxt="i32", n_nxt="i32", lr="fp32")
# As a launch specializes them: torch's pointers and a full batch's offsets are multiples of 16.
attrs = {(i,): [["tt.divisibility", 16]] for i in range(12)}
def compile_step(v, update=True):
    consts = dict(K=784, C=10, SPLITS=v.splits, BLOCK_B=128, BLOCK_K=v.block_k,
                  BLOCK_C=tf.BLOCK_C, UPDATE=update, PREC=v.precision,
                  DW_BY_CLASS=v.dw_by_class, PDL=v.pdl)
    src = ASTSource(fn=tf.sgd_step_kernel, constexprs=consts, attrs=attrs,
                    signature={**sig, **{k: "constexpr" for k in consts}})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": v.num_warps, "launch_pdl": v.pdl})
"""

# Prints, for each variant tag given, the SASS lines of its step kernel that read R1 as data.
COMPILE = PRELUDE + r"""
nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
if not os.path.exists(nvdisasm):
    print(json.dumps({"skip": f"this Triton has no {nvdisasm}"}))
    sys.exit()
out = {}
for v in tf.SWEEP:
    if v.tag not in sys.argv[1:]:
        continue
    kernel = compile_step(v)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    bad = [line.strip() for line in sass.splitlines()
           if re.search(r"\bR1\b", re.sub(r"\[[^]]*\]", "", line))  # R1 outside an address
           and "c[0x0][0x28]" not in line  # its load
           and not re.search(r"(IADD3|VIADD) R1, R1, ", line)]  # its frame
    out[v.tag] = {"r1_data_reads": bad, "hgmma": sorted(set(re.findall(r"HGMMA\.\w+", sass))),
                  "shared": kernel.metadata.shared}
print(json.dumps(out))
"""


def run_child(script: str, tags) -> dict:
    """`script` in a child without TRITON_INTERPRET (so that Triton compiles), its JSON line."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    r = subprocess.run([sys.executable, "-c", script, *tags], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def compile_steps(tags):
    got = run_child(COMPILE, tags)
    if "skip" in got:
        pytest.skip(got["skip"])
    assert sorted(got) == sorted(tags)
    return got


def test_the_variant_that_faulted_reads_no_descriptor_from_the_stack_pointer():
    from fasttrain.ladder.triton_fused import Variant

    v = Variant(64, 8, "tf32x3")
    got = compile_steps([v.tag])[v.tag]
    assert got["hgmma"], "the forward dot must still run on tensor cores (wgmma)"
    assert got["r1_data_reads"] == [], got


@pytest.mark.slow
def test_no_variant_reads_a_descriptor_from_the_stack_pointer():
    from fasttrain.ladder.triton_fused import SWEEP

    got = compile_steps([v.tag for v in SWEEP])
    assert {tag: g["r1_data_reads"] for tag, g in got.items() if g["r1_data_reads"]} == {}
    # Only the variant that needs it computes the update the other way round.
    assert [v.tag for v in SWEEP if v.dw_by_class] == ["64, 8w, tf32x3"]


# Prints, for each variant tag given, the PTX of its step kernel and of the epoch's first forward,
# and whether the launch asks for programmatic dependent launch.
PTX = PRELUDE + r"""
out = {}
for v in tf.SWEEP:
    if v.tag not in sys.argv[1:]:
        continue
    for update in (True, False):
        kernel = compile_step(v, update)
        out[f"{v.tag} {'step' if update else 'first'}"] = {
            "ptx": kernel.asm["ptx"], "launch_pdl": kernel.metadata.launch_pdl}
print(json.dumps(out))
"""
X, Y, ORDER, W, B, Z_IN, Z_OUT, STATS = range(8)  # sgd_step_kernel's pointer parameters


def global_loads(ptx: str) -> list[tuple[str, set[int]]]:
    """Each `ld.global` and `griddepcontrol` of a kernel's PTX in program order, with the
    kernel parameters a load's address derives from: a forward pass that gives every register
    the parameters of the registers it is computed from (a load's result starts afresh: the
    value read is data, not an address of ours)."""
    taint: dict[str, set[int]] = {}
    out = []
    for line in ptx.splitlines():
        s = line.split("//")[0].strip()
        param = re.match(r"ld\.param\.\w+\s+(%\w+),\s*\[\w+_param_(\d+)\]", s)
        if param:
            taint[param.group(1)] = {int(param.group(2))}
            continue
        if s.startswith("griddepcontrol"):
            out.append((s.rstrip(";"), set()))
            continue
        parts = re.sub(r"^@!?%\w+\s+", "", s).split(None, 1)
        if len(parts) < 2:
            continue
        op, args = parts
        head = args.split("}")[0] if args.startswith("{") else args.split(",")[0]
        dests = re.findall(r"%\w+", head)
        if op.startswith("ld.global"):
            address = re.search(r"\[([^\]]+)\]", args).group(1)
            out.append((op, set().union(*(taint.get(r, set())
                                          for r in re.findall(r"%\w+", address)))))
            for d in dests:
                taint[d] = set()
            continue
        if op.startswith("st."):
            continue
        sources = [r for r in re.findall(r"%\w+", args) if r not in dests]
        for d in dests:
            taint[d] = set().union(*(taint.get(r, set()) for r in sources))
    return out


def test_pdl_waits_before_what_a_step_writes_and_loads_the_rest_before():
    """With programmatic dependent launch the next step's grid runs beside this one: it may read
    before its griddepcontrol.wait only what no step writes (the pixels, labels and order), and
    must read everything a step writes (W, b, the partials, stats) after it; it lets the next
    grid launch right after its wait (not before: a cascade of waiting grids). Checked on the PTX
    by where each load's address comes from; the load order is the compiler's to change, so
    this is the check that can fail. Without PDL: no griddepcontrol at all."""
    from fasttrain.ladder import triton_fused as tf

    pdl = [v for v in tf.SWEEP if v.pdl]
    assert pdl and not tf.DEFAULT.pdl
    got = run_child(PTX, [v.tag for v in pdl] + [tf.DEFAULT.tag])
    for name, kernel in got.items():
        ops = global_loads(kernel["ptx"])
        syncs = [op for op, _ in ops if op.startswith("griddepcontrol")]
        if name.startswith(tf.DEFAULT.tag + " "):
            assert syncs == [] and not kernel["launch_pdl"], name
            continue
        assert kernel["launch_pdl"], name
        # the next grid launches once this one's wait is over: two resident at most
        assert syncs == ["griddepcontrol.wait", "griddepcontrol.launch_dependents"], name
        wait = [op for op, _ in ops].index("griddepcontrol.wait")
        before = [src for op, src in ops[:wait] if op.startswith("ld.global")]
        after = [src for op, src in ops[wait:] if op.startswith("ld.global")]
        assert ops[wait + 1][0] == "griddepcontrol.launch_dependents", name  # at once
        assert before and after, name
        for src in before:  # the pixels, labels and order, and nothing a step writes
            assert src & {X, Y, ORDER} and not src & {W, B, Z_IN, Z_OUT, STATS}, (name, src)
        for src in after:  # what a step writes; every other load went before the wait
            assert src & {W, B, Z_IN, STATS} and not src & {X, Y, ORDER}, (name, src)
        # x_{t+1}'s pixels, and a step's x_t too (one or more vector loads each, by the warps)
        pixel_loads = sum(X in src for src in before)
        assert pixel_loads >= (2 if name.endswith(" step") else 1), name
