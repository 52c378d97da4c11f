"""cuda-epoch v7's phase-profiling build (`csrc/epoch_v7_phases.cuh`): on the CPU, ptxas's
figures for the timed and the untimed epoch kernel of each variant (no spill; the untimed one
carries none of the clocks), what each variant's PTX must hold (v7b's 64-bit tagged accesses and
shuffles, v7c's named barriers, ..., v7g's chain without a vote), both Gram kernels (no spill, no
stack frame), the library's phase shape against `cuda_epoch.V7_PHASES`, and the Python reader with
the library faked at the ctypes boundary (`FakeV7Profile` writes what the kernel would); on a GPU
(marked gpu), that the phases are positive, finite and add up to each role's loop (the chain, the
workers, and v7c-v7g's helper warps), for every variant."""

import ctypes
import math
import re
import subprocess

import pytest
import torch

from fasttrain.ladder import build, epoch_phases
from fasttrain.ladder import cuda_epoch as ce
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import import_benchmark, tiny_images

requires_nvcc = pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not found on PATH")
requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# The 48 instantiations of the epoch kernel (v7a … v7k and v7m, each untimed and timed, each
# in two launches and in one: GRAMS 0, 1) in one small
# translation unit: ~8 s of nvcc for two, against ~35 s for the whole of cuda_epoch.cu (whose
# build, hopper_builds, keeps no ptxas report).
KERNELS = """#include "epoch_v7_launch.cuh"
void* const v7_kernels[] = {
    (void*)v7_epoch_kernel<false, false>, (void*)v7_epoch_kernel<true, false>,
    (void*)v7_epoch_kernel<false, true>, (void*)v7_epoch_kernel<true, true>,
    (void*)v7_epoch_kernel<false, false, 1>, (void*)v7_epoch_kernel<true, false, 1>,
    (void*)v7_epoch_kernel<false, true, 1>, (void*)v7_epoch_kernel<true, true, 1>,
    (void*)v7_epoch_kernel_c<false>, (void*)v7_epoch_kernel_c<true>,
    (void*)v7_epoch_kernel_c<false, 1>, (void*)v7_epoch_kernel_c<true, 1>,
    (void*)v7_epoch_kernel_d<false>, (void*)v7_epoch_kernel_d<true>,
    (void*)v7_epoch_kernel_d<false, 1>, (void*)v7_epoch_kernel_d<true, 1>,
    (void*)v7_epoch_kernel_e<false>, (void*)v7_epoch_kernel_e<true>,
    (void*)v7_epoch_kernel_e<false, 1>, (void*)v7_epoch_kernel_e<true, 1>,
    (void*)v7_epoch_kernel_f<false>, (void*)v7_epoch_kernel_f<true>,
    (void*)v7_epoch_kernel_f<false, 1>, (void*)v7_epoch_kernel_f<true, 1>,
    (void*)v7_epoch_kernel_g<false>, (void*)v7_epoch_kernel_g<true>,
    (void*)v7_epoch_kernel_g<false, 1>, (void*)v7_epoch_kernel_g<true, 1>,
    (void*)v7_epoch_kernel_h<false>, (void*)v7_epoch_kernel_h<true>,
    (void*)v7_epoch_kernel_h<false, 1>, (void*)v7_epoch_kernel_h<true, 1>,
    (void*)v7_epoch_kernel_i<false>, (void*)v7_epoch_kernel_i<true>,
    (void*)v7_epoch_kernel_i<false, 1>, (void*)v7_epoch_kernel_i<true, 1>,
    (void*)v7_epoch_kernel_j<false>, (void*)v7_epoch_kernel_j<true>,
    (void*)v7_epoch_kernel_j<false, 1>, (void*)v7_epoch_kernel_j<true, 1>,
    (void*)v7_epoch_kernel_k<false>, (void*)v7_epoch_kernel_k<true>,
    (void*)v7_epoch_kernel_k<false, 1>, (void*)v7_epoch_kernel_k<true, 1>,
    (void*)v7_epoch_kernel_m<false>, (void*)v7_epoch_kernel_m<true>,
    (void*)v7_epoch_kernel_m<false, 1>, (void*)v7_epoch_kernel_m<true, 1>,
    (void*)v7_epoch_kernel_n<false>, (void*)v7_epoch_kernel_n<true>,
    (void*)v7_epoch_kernel_n<false, 1>, (void*)v7_epoch_kernel_n<true, 1>,
    (void*)v7_gram_kernel, (void*)v7_gram_kernel_v2};
"""
EPOCH_KERNELS = {f"{build}{v7b}{one}": f"v7_epoch_kernelILb{t}ELb{b}ELi{g}E"
                 for one, g in (("", 0), (" one launch", 1)) for v7b, b in (("", 0), (" v7b", 1))
                 for build, t in (("untimed", 0), ("timed", 1))}
EPOCH_KERNELS |= {f"{build} v7{c}{one}": f"v7_epoch_kernel_{c}ILb{t}ELi{g}E"
                  for c in ("c", "d", "e", "f", "g", "h", "i", "j", "k", "m", "n")
                  for one, g in (("", 0), (" one launch", 1))
                  for build, t in (("untimed", 0), ("timed", 1))}
"""ptxas's names of v7_epoch_kernel<TIMED, V7B, GRAMS> ("untimed", "timed v7b one launch", …), of
v7c's v7_epoch_kernel_c<TIMED, GRAMS> ("untimed v7c", "timed v7c one launch", …), of v7d's
v7_epoch_kernel_d<TIMED, GRAMS> ("untimed v7d", "timed v7d one launch", …) and of v7e's
v7_epoch_kernel_e<TIMED, GRAMS> ("untimed v7e", …) and of v7f's … v7k's, v7m's and v7n's."""
GRAM_KERNELS = {"gram v1": ("v7_gram_kernelE", 128), "gram v2": ("v7_gram_kernel_v2E", 128)}
"""ptxas's names of the Gram kernels (v1, v2 of csrc/epoch_v7.cuh) and their register caps: v1's
128 threads could have 255, but 128 keeps 4 CTAs an SM; v2's 512 threads (__launch_bounds__(512,
1)) cap a thread at 128."""


@pytest.fixture(scope="module")
def ptxas_report(tmp_path_factory):
    """{kind of EPOCH_KERNELS or GRAM_KERNELS: {"regs", "stack", "spill_stores", "spill_loads",
    "ptx"}}, from `nvcc -Xptxas -v` for sm_90a (the build's target) and its kept PTX."""
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found on PATH")
    d = tmp_path_factory.mktemp("v7phases")
    (d / "v7k.cu").write_text(KERNELS)
    r = subprocess.run([nvcc, "-O3", "-std=c++17", "-arch=sm_90a", "-cubin", "-Xptxas", "-v",
                        "--keep", "--keep-dir", str(d), f"-I{build.CSRC}", str(d / "v7k.cu"),
                        "-o", str(d / "v7k.cubin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ptx = (d / "v7k.ptx").read_text()
    # Each function's PTX runs from its .entry or .func line to the next one (inline asm blocks
    # have braces at column 0 too, so "}" does not end a function).
    chunks = re.split(r"^(?=\.entry |\.func )", ptx, flags=re.M)
    entries = {m.group(1): c for c in chunks if (m := re.match(r"\.entry (\w+)\(", c))}
    report = {}
    kernels = {**EPOCH_KERNELS, **{kind: name for kind, (name, _) in GRAM_KERNELS.items()}}
    for kind, name in kernels.items():
        mangled = next(e for e in entries if name in e)
        props = re.search(rf"Function properties for {mangled}\n\s*(\d+) bytes stack frame, "
                          rf"(\d+) bytes spill stores, (\d+) bytes spill loads\n.*?Used (\d+) "
                          rf"registers", r.stderr, re.S)
        assert props, r.stderr
        stack, stores, loads, regs = map(int, props.groups())
        report[kind] = {"regs": regs, "stack": stack, "spill_stores": stores,
                        "spill_loads": loads, "ptx": entries[mangled]}
    return report


@requires_nvcc
@pytest.mark.parametrize("kind", list(EPOCH_KERNELS))
def test_neither_build_of_the_epoch_kernel_spills(ptxas_report, kind):
    """512 threads a CTA cap a thread at 128 registers; the untimed kernel is at the cap (nvcc
    13.0), so clocks kept in registers could have pushed the timed one into local memory. v7b's
    poll returns its sum in a 64-bit register from a function of its own (no stack frame)."""
    k = ptxas_report[kind]
    figures = {key: v for key, v in k.items() if key != "ptx"}
    assert k["regs"] <= 128 and k["stack"] == k["spill_stores"] == k["spill_loads"] == 0, figures


@requires_nvcc
@pytest.mark.parametrize("kind", list(GRAM_KERNELS))
def test_neither_gram_kernel_spills(ptxas_report, kind):
    """Gram kernel v2 keeps 64 s32 accumulators, its A and B fragments and its 5 source rows in
    registers (nvcc 13.0, sm_90a: 112, 118 since it also clears v7b's ring, no stack); a row or
    lag index into its job's arrays that is not a constant would put them in local memory (a
    stack frame: 104 bytes in its first build), so a stack frame fails too."""
    k = ptxas_report[kind]
    figures = {key: v for key, v in k.items() if key != "ptx"}
    cap = GRAM_KERNELS[kind][1]
    assert k["regs"] <= cap and k["stack"] == k["spill_stores"] == k["spill_loads"] == 0, figures


@requires_nvcc
def test_gram_kernel_v2_stages_with_cp_async_and_reads_with_ldmatrix(ptxas_report):
    """Its PTX: the 16-byte zero-filling cp.async, a commit and waits, ldmatrix .x4 and the u8
    mma; no ld.local (see above)."""
    ptx = ptxas_report["gram v2"]["ptx"]
    for op in ("cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group",
               "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
               "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32"):
        assert op in ptx, op
    assert "ld.local" not in ptx and "st.local" not in ptx


@requires_nvcc
def test_v7b_hands_the_partials_over_as_64_bit_scalars(ptxas_report):
    """v7b's tagged words: one st.relaxed.gpu .b64 a value, polled by ld.relaxed.gpu .b64 (scalar
    accesses: single-copy atomic; a .v2 would be two accesses), its softmax by shfl.sync.bfly;
    no counter publish by its workers (v7a's st.release stays, for the chain's G counters)."""
    ptx, v7a = ptxas_report["untimed v7b"]["ptx"], ptxas_report["untimed"]["ptx"]
    assert "st.relaxed.gpu.global.b64" in ptx and "ld.relaxed.gpu.global.b64" in ptx
    assert "shfl.sync.bfly.b32" in ptx and "shfl.sync.bfly.b32" not in v7a
    assert ".v2.b32" not in "".join(line for line in ptx.splitlines() if "relaxed" in line)
    assert "st.relaxed.gpu" not in v7a
    assert ptx.count("st.release.gpu.global") < v7a.count("st.release.gpu.global")


@requires_nvcc
def test_v7c_splits_its_chain_by_named_barriers(ptxas_report):
    """v7c (csrc/epoch_v7c.cuh): the critical warps' barriers are named barrier 1 of 256 threads
    (their failure votes bar.red.or), the hand-off to the helper warps named barrier 2 of 512,
    both with immediate ids (a register id makes ptxas reserve all 16); its lane sums pick every
    register by a constant index (an indexed pick after an all-reduce was a 40-byte stack frame:
    no ld.local/st.local); v7b's tagged words and shuffles stay."""
    ptx = ptxas_report["untimed v7c"]["ptx"]
    assert "bar.sync 1, 256;" in ptx and "bar.sync 2, 512;" in ptx
    assert "bar.red.or.pred" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert "st.relaxed.gpu.global.b64" in ptx and "ld.relaxed.gpu.global.b64" in ptx
    assert "shfl.sync.bfly.b32" in ptx


@requires_nvcc
def test_v7d_loads_g_ahead_only_after_an_acquire_and_a_warp_barrier(ptxas_report):
    """v7d (csrc/epoch_v7d.cuh, V7GAhead::ahead): lanes 0-7 of a fetching warp read the chain's
    counters with ld.acquire.gpu, the warp votes and passes __syncwarp (bar.warp.sync), and only
    then are G's rows loaded (ld.global.cg.v4.f32): the loads never come before the check. In
    the PTX's text order: the first global load after the acquire has a bar.warp.sync between
    them. v7c's kernel has no such acquire (its workers poll in a function of their own)."""
    ptx = ptxas_report["untimed v7d"]["ptx"]
    assert "ld.acquire.gpu" not in ptxas_report["untimed v7c"]["ptx"]
    acquire = ptx.index("ld.acquire.gpu")
    load = ptx.index("ld.global.cg.v4.f32", acquire)
    assert "bar.warp.sync" in ptx[acquire:load] and "vote.sync.all" in ptx[acquire:load]


@requires_nvcc
def test_v7e_runs_its_workers_on_the_tensor_cores(ptxas_report):
    """v7e (csrc/epoch_v7e.cuh): its workers' update and partials are mma.sync m16n8k16 with fp16
    operands and fp32 accumulation (the v8 probe's bodies), which v7d's kernel has none of (its
    one-launch Gram producers' mma is u8); v7c's chain is there as it was (its named barriers),
    v7d's fetch ahead too (the acquire before G's loads); nothing in local memory."""
    f16 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    for one in ("", " one launch"):
        ptx = ptxas_report["untimed v7e" + one]["ptx"]
        assert f16 in ptx and f16 not in ptxas_report["untimed v7d" + one]["ptx"]
        assert "bar.sync 1, 256;" in ptx and "bar.sync 2, 512;" in ptx
        acquire = ptx.index("ld.acquire.gpu")
        assert "bar.warp.sync" in ptx[acquire:ptx.index("ld.global.cg.v4.f32", acquire)]
        assert "ld.local" not in ptx and "st.local" not in ptx


@requires_nvcc
def test_v7f_reduce_scatters_its_partials(ptxas_report):
    """v7f (csrc/epoch_v7f.cuh): the tiles of P_t go by 8-byte st.async into the owners' inboxes
    and the credits back by remote mbarrier arrives (v7e's kernel has neither), on v7e's f16 mma;
    nothing in local memory."""
    for one in ("", " one launch"):
        ptx = ptxas_report["untimed v7f" + one]["ptx"]
        v7e = ptxas_report["untimed v7e" + one]["ptx"]
        send = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32"
        credit = "mbarrier.arrive.release.cluster.shared::cluster.b64"
        assert send in ptx and credit in ptx and send not in v7e and credit not in v7e
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
        assert "ld.local" not in ptx and "st.local" not in ptx


@requires_nvcc
def test_v7gs_critical_warps_take_no_vote_and_its_helpers_poll(ptxas_report):
    """v7g (csrc/epoch_v7g.cuh): v7f's workers (their st.async sends, the f16 mma) with a chain
    whose critical warps hold no failure vote in the loop (a failed G wait sets the stop flag,
    read after the hand-off): one bar.red.or of named barrier 1 (the last G wait's), where v7f has
    two; the tagged words still polled (by the helpers) as 64-bit relaxed loads; nothing in local
    memory."""
    vote = re.compile(r"bar\.red\.or\.pred\s+\S+,\s*1,\s*256")
    for one in ("", " one launch"):
        ptx = ptxas_report["untimed v7g" + one]["ptx"]
        v7f = ptxas_report["untimed v7f" + one]["ptx"]
        assert len(vote.findall(ptx)) == 1 and len(vote.findall(v7f)) == 2
        assert "ld.relaxed.gpu.global.b64" in ptx and "bar.sync 2, 512;" in ptx
        assert "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32" in ptx
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
        assert "ld.local" not in ptx and "st.local" not in ptx


@requires_nvcc
def test_v7is_helpers_store_g_and_release_the_count(ptxas_report):
    """v7i (csrc/epoch_v7i.cuh): its critical warps say "G_t is in gl" with one bar.arrive on named
    barrier 3 (512 threads, no wait) and leave the send without a barrier (v7h: 3 bar.sync of
    barrier 1, v7i 2); its helpers wait on barrier 3 (in their loop and after it), store G's rows
    as 16-byte global stores (v7h's critical warps: st.global.v4.f32 in the send loop, none left
    there in v7i) and release the counter at three places (the loop's top, and twice after it:
    steps − 1, steps), the tail after a barrier of the 256 helper threads; nothing in local
    memory. v7h has none of barriers 3, 4."""
    for one in ("", " one launch"):
        ptx = ptxas_report["untimed v7i" + one]["ptx"]
        v7h = ptxas_report["untimed v7h" + one]["ptx"]
        assert ptx.count("bar.arrive 3, 512;") == 1 and ptx.count("bar.sync 3, 512;") == 2
        assert ptx.count("bar.sync 4, 256;") == 1
        assert not any(b in v7h for b in ("bar.arrive 3", "bar.sync 3", "bar.sync 4"))
        assert ptx.count("bar.sync 1, 256;") == v7h.count("bar.sync 1, 256;") - 1
        assert "st.global.v4.f32" in v7h and "st.global.v4.f32" not in ptx
        assert "st.global.v4.u32" in ptx and "st.global.v4.u32" not in v7h
        release = "st.release.gpu.global.s32"
        assert ptx.count(release) == v7h.count(release) + 2
        assert "ld.local" not in ptx and "st.local" not in ptx


@requires_nvcc
def test_v7js_workers_load_their_fragments_by_ldmatrix(ptxas_report):
    """v7j (csrc/epoch_v7j.cuh): its workers' mma operands come by ldmatrix.x4 (the partials' A)
    and .x4.trans (the update's A and B, 2 k-steps, in the loop's update and the drain's: 8; the
    partials' B: 1), where v7i loads them by 64 16-bit shared loads (the update's, twice) and
    none of its own ldmatrix; the same 10 f16 mma (the chains unchanged); x gathered by 16-bit
    loads of pixel pairs (v7i: 8-bit loads) and turned into halves by an f16x2 subtraction
    (v7i: a u16 → f32 conversion a byte); v7i's chain (its barrier 3); nothing in local
    memory."""
    trans = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
    plain = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
    f16 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    for one in ("", " one launch"):
        ptx = ptxas_report["untimed v7j" + one]["ptx"]
        v7i = ptxas_report["untimed v7i" + one]["ptx"]
        assert ptx.count(trans) == 9 and ptx.count(plain) == 1
        assert trans not in v7i and plain not in v7i
        assert v7i.count("ld.shared.u16") == 64 and "ld.shared.u16" not in ptx
        assert ptx.count(f16) == v7i.count(f16) == 10
        assert "ld.global.u8" in v7i and "ld.global.u8" not in ptx and "ld.global.u16" in ptx
        assert "cvt.rn.f32.u16" in v7i and "cvt.rn.f32.u16" not in ptx and "sub.f16x2" in ptx
        assert ptx.count("bar.arrive 3, 512;") == 1
        assert "ld.local" not in ptx and "st.local" not in ptx


@requires_nvcc
def test_v7ks_workers_have_two_barriers_fewer_and_read_the_counters_early(ptxas_report):
    """v7k (csrc/epoch_v7k.cuh): v7j's workers with G′ staged before the vote's barrier, so two
    `bar.sync 0` fewer than v7j (the staging barrier of the update, inlined in the loop and in
    the drain; the step's "x_t in place" barrier stays once, behind its test: with an update a
    step runs 4 CTA-wide barriers where v7j runs 6, the two `bar.red.or` votes and the rest
    unchanged); the chain counters read once more (the step's top: ld.relaxed.gpu, v7j's acquire
    kept as the fallback) and one fence.acquire.gpu, no fence.acq_rel (it would wait for the
    partials' st.asyncs); the same ldmatrix, mma and v7i chain as v7j; nothing in local
    memory."""
    trans = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
    f16 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    for kind in ("untimed", "timed"):
        for one in ("", " one launch"):
            ptx = ptxas_report[f"{kind} v7k{one}"]["ptx"]
            v7j = ptxas_report[f"{kind} v7j{one}"]["ptx"]
            def n(pattern, text):
                return len(re.findall(pattern, text))
            cta_sync, vote = r"bar\.sync\s+0;", r"bar\.red\.or\.pred\s+%p\d+, 0,"
            assert n(cta_sync, ptx) == n(cta_sync, v7j) - 2, (n(cta_sync, ptx), n(cta_sync, v7j))
            assert n(vote, ptx) == n(vote, v7j) >= 2
            relaxed, acquire = r"ld\.relaxed\.gpu\.global\.s32", r"ld\.acquire\.gpu\.global\.s32"
            assert n(relaxed, ptx) == n(relaxed, v7j) + 1
            assert n(acquire, ptx) == n(acquire, v7j) >= 1
            assert ptx.count("fence.acquire.gpu;") == 1 and "fence.acquire.gpu" not in v7j
            assert ptx.count("fence.acq_rel.gpu;") == v7j.count("fence.acq_rel.gpu;")
            assert ptx.count(trans) == v7j.count(trans) and ptx.count(f16) == v7j.count(f16)
            assert ptx.count("bar.arrive 3, 512;") == 1
            assert "ld.local" not in ptx and "st.local" not in ptx


@requires_nvcc
def test_v7ms_critical_warps_send_their_rows_with_one_barrier_wait(ptxas_report):
    """v7m (csrc/epoch_v7m.cuh): v7j's kernel whose critical warps hold one bar.sync of named
    barrier 1 in the loop (warp 0's, before the column sums) where v7j has two, and one
    bar.arrive on it (warps 1-7); the same st.async v4 sends at three sites (a lane's two items of
    its warp's rows, warp 0's sums) where v7j's peeled send loop has more; barrier 3's arrive as
    i's; the loss's log after the sends (its place is not countable in PTX: the same count of
    lg2 as v7j's); nothing in local memory."""
    send = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32"
    for one in ("", " one launch"):
        ptx = ptxas_report["untimed v7m" + one]["ptx"]
        v7j = ptxas_report["untimed v7j" + one]["ptx"]
        assert ptx.count("bar.sync 1, 256;") == v7j.count("bar.sync 1, 256;") - 1
        assert ptx.count("bar.arrive 1, 256;") == 1 and "bar.arrive 1, 256;" not in v7j
        assert ptx.count("bar.arrive 3, 512;") == 1 and ptx.count("bar.sync 3, 512;") == 2
        assert ptx.count(send) == 3 < v7j.count(send)
        assert ptx.count("lg2.approx") == v7j.count("lg2.approx")
        assert "ld.local" not in ptx and "st.local" not in ptx


@requires_nvcc
def test_v7ns_critical_tail_has_no_barrier_and_its_helpers_sum_the_bias(ptxas_report):
    """v7n (csrc/epoch_v7n.cuh): v7k's kernel whose critical warps send no column sums: none of
    k's two bar.sync of named barrier 1 in the loop is left (the one there is the last bias's,
    after the loop) and no bar.arrive on it (m's); the st.async v4 sends at three sites (a lane's
    two items of its warp's rows, warp 0's tokens) where k's peeled send loop has seven; the
    helper warps 9-11 wait on the slot's mbarrier once more (one try_wait more than k) and meet
    on named barrier 5 (96 threads) for the bias; barrier 3 as i's; nothing in local memory."""
    send = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32"
    for one in ("", " one launch"):
        ptx = ptxas_report["untimed v7n" + one]["ptx"]
        v7k = ptxas_report["untimed v7k" + one]["ptx"]
        assert ptx.count("bar.sync 1, 256;") == v7k.count("bar.sync 1, 256;") - 1 == 1
        assert "bar.arrive 1, 256;" not in ptx and ptx.count("bar.sync 5, 96;") == 1
        assert ptx.count("bar.arrive 3, 512;") == 1 and ptx.count("bar.sync 3, 512;") == 2
        assert ptx.count(send) == 3 < v7k.count(send)
        assert ptx.count("mbarrier.try_wait") == v7k.count("mbarrier.try_wait") + 1
        assert "ld.local" not in ptx and "st.local" not in ptx


@requires_nvcc
def test_only_the_timed_build_reads_the_clocks(ptxas_report):
    """The row's kernel carries nothing of the profile: no clock or global timer read (its bounded
    waits' clock64 reads are in functions of their own, not inlined) and no phase array; the timed
    one reads the global timer at the start and end of each role's loop (v7c-v7m: the helper
    warps' loop too), the clock at least once a phase (clock() is a %clock64 read in PTX), and
    writes both arrays."""
    for suffix in ("", " v7b", " v7c", " v7d", " v7e", " v7f", " v7g", " v7h", " v7i", " v7j",
                   " v7k", " v7m", " v7n",
                   " one launch", " v7b one launch", " v7c one launch", " v7d one launch",
                   " v7e one launch", " v7f one launch", " v7g one launch", " v7h one launch",
                   " v7i one launch", " v7j one launch", " v7k one launch", " v7m one launch",
                   " v7n one launch"):
        untimed = ptxas_report["untimed" + suffix]["ptx"]
        timed = ptxas_report["timed" + suffix]["ptx"]
        helpers = any(f"v7{v}" in suffix for v in ce.V7_HELPERS)
        assert "%clock" not in untimed and "%globaltimer" not in untimed
        assert timed.count("%globaltimer") == (6 if helpers else 4)
        phases = (len(ce.V7_PHASES["chain"]) + len(ce.V7_PHASES["workers"])
                  + helpers * len(ce.V7_PHASES["helpers"]))
        assert timed.count("%clock64") >= phases
        for text, used in ((untimed, False), (timed, True)):
            assert ("g_v7_phase_clocks" in text) == ("g_v7_phase_ns" in text) == used


@requires_nvcc
def test_the_library_times_the_phases_python_names(hopper_builds):
    try:
        lib = ctypes.CDLL(str(hopper_builds["cuda_epoch.cu"]))
    except OSError as e:
        pytest.skip(f"cannot load the library without a CUDA runtime: {e}")
    shape = [ctypes.c_int() for _ in range(5)]
    lib.cuda_epoch_v7_phase_shape(*map(ctypes.byref, shape))
    chain, workers, helpers, rows, cols = (s.value for s in shape)
    assert (chain, workers, helpers) == tuple(len(ce.V7_PHASES[r]) for r in ce.V7_PHASES)
    assert rows == 64 + 8 and cols == max(chain, workers, helpers)  # + the chain's helper warps
    # Bad arguments are refused before anything reaches a GPU (1: cudaErrorInvalidValue).
    p = ctypes.c_void_p
    lib.cuda_epoch_v7_phase_profile.argtypes = [p, p, p, ctypes.c_int, ctypes.c_int,
                                                ctypes.c_float, p, p, p, p, ctypes.c_int,
                                                ctypes.c_int, p, p, p]
    dummy = p(16)
    past = len(ce.V7_VARIANTS)  # the first variant the library has not
    for n, batch, scratch, variant, grams in (
            (1, 0, dummy, 0, 0), (1, 129, dummy, 1, 0), (0, 128, dummy, 0, 0),
            (1, 128, None, 1, 0), (1, 128, dummy, past, 0), (1, 128, dummy, -1, 0),
            (1, 128, dummy, 0, 2), (1, 128, dummy, 1, -1), (1, 128, dummy, past, 1)):
        assert lib.cuda_epoch_v7_phase_profile(dummy, dummy, dummy, n, batch, 0.1, dummy, dummy,
                                               dummy, scratch, variant, grams, dummy, dummy,
                                               None) == 1
    assert lib.cuda_epoch_v7_variants() == len(ce.V7_VARIANTS)


class FakeV7Profile:
    """The library at the ctypes boundary: the phase shape and a profile that writes, for row i
    (CTAs 0-63, then v7c-v7i's helper warps of chain CTA i - 64) and phase j of its role,
    `clocks(i, j)` clocks, and a span of its clocks at `clocks_per_ns` (or `spans`); `timeout`:
    cuda_epoch_signal_status reports a timed-out wait."""

    def __init__(self, steps=10, clocks_per_ns=2.0, shape=(8, 7, 8, 72, 8), spans=None,
                 timeout=False):
        self.steps, self.rate, self.shape, self.spans = steps, clocks_per_ns, shape, spans
        self.timeout, self.calls = timeout, []

    @staticmethod
    def clocks(i, j):
        return 1000 * (j + 1) + 10 * i

    def cuda_epoch_v7_phase_shape(self, *out):
        for ref, v in zip(out, self.shape, strict=True):
            ref._obj.value = v

    def cuda_epoch_v7_phase_profile(self, x, y, order, n, bs, lr, w, b, stats, scratch, variant,
                                    grams, clocks, span, stream):
        self.calls.append((n, bs, scratch.value, variant, grams))
        chain, workers, helpers, ctas, cols = self.shape
        for i in range(ctas):
            if i >= 64 and ce.V7_VARIANTS[variant] not in ce.V7_HELPERS:
                continue  # no helper warps: their rows stay 0
            for j in range(chain if i < 8 else workers if i < 64 else helpers):
                clocks[i * cols + j] = self.clocks(i, j)
            own = sum(clocks[i * cols:(i + 1) * cols])
            span[i] = self.spans[i] if self.spans else round(own / self.rate)
        span[ctas] = self.steps
        return 0

    def cuda_epoch_signal_status(self, stream, detail):
        if not self.timeout:
            return 0
        detail._obj.value = 4 | 9 << 4 | 3 << 12  # v7's G wait, CTA 9, step 3
        return ce.SIGNAL_TIMEOUT

    def cuda_epoch_error_name(self, code):
        return b"cudaErrorFake"


def fake_kernel(lib, monkeypatch, v7_variant="a", v7_grams="kernel"):
    """An EpochKernel of version 7 on CPU tensors, as __init__ would leave it."""
    monkeypatch.setattr(ce, "stream_handle", lambda: None)
    k = object.__new__(ce.EpochKernel)
    k.lib, k.version, k.cluster, k.ctas, k.n = lib, 7, True, ce.V7_CTAS, 150
    k.v7_variant, k.v7_grams_by = v7_variant, v7_grams
    k.cfg = LadderConfig(batch_size=16)
    k.x, k.y = torch.zeros(150, 784, dtype=torch.uint8), torch.zeros(150, dtype=torch.int32)
    k.orders = torch.zeros(2, 150, dtype=torch.int32)
    k.w, k.b, k.stats = torch.ones(10, 784), torch.ones(10), torch.zeros(2)
    k.scratch = torch.zeros(64)
    return k


@pytest.mark.parametrize("v7_grams", ce.V7_GRAMS)
@pytest.mark.parametrize("v7_variant", ce.V7_VARIANTS)
def test_the_reader_turns_clocks_into_us_a_step_per_role(monkeypatch, v7_variant, v7_grams):
    lib = FakeV7Profile(steps=10, clocks_per_ns=2.0)
    k = fake_kernel(lib, monkeypatch, v7_variant, v7_grams)
    profile = k.phase_profile(1)
    assert lib.calls == [(150, 16, k.scratch.data_ptr(), ce.V7_VARIANTS.index(v7_variant),
                          ce.V7_GRAMS.index(v7_grams))]
    helpers = v7_variant in ce.V7_HELPERS
    assert list(profile) == ["chain", "workers"] + ["helpers"] * helpers
    for role, rows in (("chain", range(8)), ("workers", range(8, 64)),
                       ("helpers", range(64, 72)))[:2 + helpers]:
        names = ce.V7_PHASES[role]
        p = profile[role]
        assert list(p["mean_us"]) == list(p["max_us"]) == list(names)
        for j, name in enumerate(names):  # clocks / (2 a ns) / 10 steps / 1000 = µs a step
            us = [lib.clocks(i, j) / 2 / 10 / 1e3 for i in rows]
            assert p["mean_us"][name] == pytest.approx(sum(us) / len(us))
            assert p["max_us"][name] == pytest.approx(max(us))
        # Every CTA's span is its clocks at 2 a ns: the phases add up to the step.
        assert sum(p["mean_us"].values()) == pytest.approx(p["step_us"], rel=1e-3)
        assert p["clock_ghz"] == pytest.approx({"mean": 2.0, "min": 2.0, "max": 2.0}, rel=1e-3)
    assert torch.equal(k.w, torch.ones(10, 784))  # it trained copies


def test_the_reader_converts_every_cta_at_its_own_rate(monkeypatch):
    """Worker spans twice their clocks' time at the chain's rate (their SMs at half its clock, as
    an H200 ran v7f's workers ~9 % slower): each role's phases still add up to its step, and its
    clock rate says so (at chain CTA 0's rate the workers' phases would be half their step)."""
    spans = [round(sum(FakeV7Profile.clocks(i, j) for j in range(8 if i < 8 else 7)) / 2)
             * (1 if i < 8 else 2) for i in range(64)] + [0] * 8  # v7a: no helper warps
    profile = fake_kernel(FakeV7Profile(spans=spans), monkeypatch).phase_profile(0)
    for role, ghz in (("chain", 2.0), ("workers", 1.0)):
        p = profile[role]
        assert sum(p["mean_us"].values()) == pytest.approx(p["step_us"], rel=1e-3)
        assert p["clock_ghz"]["min"] == pytest.approx(ghz, rel=1e-3)
        assert p["clock_ghz"]["max"] == pytest.approx(ghz, rel=1e-3)
    # CTA 63's load x, the workers' largest: its clocks at 1 a ns over 10 steps, in µs.
    assert profile["workers"]["max_us"]["load x"] == pytest.approx(
        FakeV7Profile.clocks(63, 0) / 1.0 / 10 / 1e3, rel=1e-2)


@pytest.mark.parametrize("fault", ["stale build", "no span", "timeout"])
def test_the_reader_refuses_figures_it_cannot_trust(monkeypatch, fault):
    lib = {"stale build": FakeV7Profile(shape=(6, 7, 8, 72, 7)),
           "no span": FakeV7Profile(spans=[1000] * 20 + [0] + [1000] * 51),
           "timeout": FakeV7Profile(timeout=True)}[fault]
    match = {"stale build": "6 chain, 7 worker and 8 helper phases, not V7_PHASES",
             "no span": r"CTAs \[20\] wrote no figures",
             "timeout": r"CTA 9 waited too long for v7's G \(worker\) at step 3"}[fault]
    with pytest.raises(RuntimeError, match=match):
        fake_kernel(lib, monkeypatch).phase_profile(0)


def test_sync_cost_prints_and_records_each_role(monkeypatch, capsys):
    sync_cost = import_benchmark("sync_cost")
    k = fake_kernel(FakeV7Profile(), monkeypatch)
    recorded = sync_cost.profile_phases(k)
    assert list(recorded) == [f"{k.variant}: chain", f"{k.variant}: workers"]
    out = capsys.readouterr().out
    assert "its chain phases (µs a step" in out and "its workers phases (µs a step" in out
    assert "wait partials 0.10/0.10" in out  # chain CTAs 0-7: (2000 + 10 i) clocks / 2 / 10 / 1e3
    assert "SMs at 2.00-2.00 GHz" in out
    k.lib = FakeV7Profile(timeout=True)
    recorded = sync_cost.profile_phases(k)
    assert list(recorded) == [k.variant] and "waited too long" in recorded[k.variant]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("v7_grams", ce.V7_GRAMS)
@pytest.mark.parametrize("v7_variant", ce.V7_VARIANTS)
def test_v7s_phases_are_positive_and_account_for_each_roles_loop(v7_variant, v7_grams):
    """The profiling build on a 40-step epoch: every phase of both roles positive and finite (0 for
    those the variant does not clock, V7_UNTIMED), the slowest CTA's at least the mean, each
    role's phase means adding up to its CTAs' loop, every CTA's clock rate over its loop an SM's
    and all within 25 % of each other; the kernel's own weights untouched."""
    if not ce.has_clusters():
        pytest.skip("v7 runs on thread-block clusters only")
    cfg = LadderConfig(epochs=1, batch_size=128)
    data = make_ladder_data(tiny_images(n_train=128 * 40), cfg)
    k = ce.EpochKernel(data, cfg, version=7, v7_variant=v7_variant, v7_grams=v7_grams)
    w0 = k.w.clone()
    profile = k.phase_profile(0)
    assert torch.equal(k.w, w0)
    roles = [r for r in ce.V7_PHASES if r != "helpers" or v7_variant in ce.V7_HELPERS]
    assert list(profile) == roles
    for role, p in profile.items():
        assert list(p["mean_us"]) == list(ce.V7_PHASES[role])
        untimed = epoch_phases.V7_UNTIMED.get(v7_variant, {}).get(role, ())
        assert all(v == 0 if n in untimed else v > 0 and math.isfinite(v)
                   for n, v in p["mean_us"].items()), (role, p)
        assert all(p["max_us"][n] >= p["mean_us"][n] for n in p["mean_us"]), (role, p)
        assert sum(p["mean_us"].values()) == pytest.approx(p["step_us"], rel=1e-6), (role, p)
        assert 0.5 < p["clock_ghz"]["min"] <= p["clock_ghz"]["max"] < 3.0, (role, p)
    # SMs clock apart (an H200, run 9: v7f's tensor-core workers 1.77-1.80 GHz, its chain
    # 1.93-1.94), but not by a quarter: a role whose marks missed a quarter of its loop would read
    # as an SM that much slower.
    rates = [p["clock_ghz"] for p in profile.values()]
    assert min(r["min"] for r in rates) >= 0.75 * max(r["max"] for r in rates), profile
    k.run(0)  # the row's build still runs after the timed one
