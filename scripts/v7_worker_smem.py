"""The shared-memory side of cuda-epoch v7h/v7i's worker mma (csrc/v8_workers.cuh:
v8_mma_update_sums, v8_mma_partial) against the ldmatrix loads the design doc's "v7j" proposes.

1. Wavefronts: how many passes over the 32 banks a step's fragment loads take in one worker CTA
   (a warp's load of n distinct 4-byte words in one bank costs n passes; lanes reading the same
   word share it). The SASS (nvcc 13.0, sm_90a) issues the update's operands as LDS.U16 (32 a
   warp, 8 warps) and the partials' as LDS.32 (8 a warp, 16 warps); the counts below are theirs
   and the proposal's (ldmatrix .x4, with and without an XOR swizzle of a row's two 16-byte
   halves by bit 2 of the row).
2. The proposal's fragments: ldmatrix emulated from the PTX ISA's description ("warp-level matrix
   load instruction: ldmatrix": thread 8m + j gives the address of row j of matrix m; lane l
   receives, in register m, elements (l / 4, 2(l % 4) + h) of matrix m, or (2(l % 4) + h, l / 4)
   with .trans) on random x, G' and W pieces in the workers' layouts, compared with the elements
   the current code loads through v8_a_at / v8_b_at (as in v8_mma.cuh). A CPU check of the
   design's addressing, not of any kernel.

    python scripts/v7_worker_smem.py
"""

from collections import defaultdict

import numpy as np

BMAX = 128


def a_at(lane: int, r: int, h: int) -> tuple[int, int]:  # v8_mma.cuh's v8_a_at
    g, q = lane >> 2, lane & 3
    return g + 8 * (r & 1), 2 * q + 8 * (r >> 1) + h


def b_at(lane: int, r: int, h: int) -> tuple[int, int]:  # v8_b_at
    g, q = lane >> 2, lane & 3
    return 2 * q + 8 * r + h, g


def waves(byte_addrs: list[int], width: int = 4) -> int:
    banks: dict[int, set[int]] = defaultdict(set)
    for a in byte_addrs:
        for w in range(width // 4):
            word = a // 4 + w
            banks[word % 32].add(word)
    return max(len(s) for s in banks.values())


def half_at(row: int, col: int, swizzle: bool) -> int:
    """Halves of a [rows][16] fp16 array: the 16-byte half col // 8, XORed with bit 2 of row."""
    hb = col // 8 ^ ((row >> 2) & 1 if swizzle else 0)
    return row * 16 + 8 * hb + col % 8


def ldsm_rows(rows: list[int], fh: int, swizzle: bool) -> list[int]:
    """Byte addresses of one 8 × 8 matrix's 8 rows of 16 bytes (columns 8·fh …)."""
    return [2 * half_at(i, 8 * fh, swizzle) + b for i in rows for b in range(0, 16, 4)]


def wavefront_counts() -> dict[str, int]:
    n: dict[str, int] = defaultdict(int)
    for u in range(8):  # the update: warp u, n-tile u & 1, row quarter u >> 1
        nt, kq = u & 1, u >> 1
        for ks in range(2):
            i0 = 32 * kq + 16 * ks
            for r in range(4):  # A = Xᵀ, one LDS.U16 a half
                for h in range(2):
                    n["update now"] += waves([2 * ((i0 + a_at(ln, r, 0)[1] + h) * 16
                                                   + a_at(ln, r, 0)[0]) for ln in range(32)])
            for r in range(2):  # B = G' hi, lo
                for h in range(2):
                    for piece in range(2):
                        n["update now"] += waves([2 * ((i0 + b_at(ln, r, 0)[0] + h) * 16 + 8 * nt
                                                       + b_at(ln, r, 0)[1] + piece * BMAX * 16)
                                                  for ln in range(32)])
            for sw in (False, True):  # A: ldmatrix.x4.trans; B: .x4.trans (hi k 0-7, 8-15, lo …)
                key = "update ldmatrix" + (" swizzled" if sw else "")
                for m in range(4):
                    n[key] += waves(ldsm_rows([i0 + 8 * (m >> 1) + j for j in range(8)], m & 1, sw))
                    n[key] += waves(ldsm_rows([i0 + 8 * (m & 1) + j for j in range(8)], nt, sw))
    for w in range(16):  # the partials: warp w, m-tile w & 7, n-tile w >> 3
        mt, nt = w & 7, w >> 3
        for r in range(4):  # A = X, LDS.32
            n["partials now"] += waves(
                [2 * ((16 * mt + a_at(ln, r, 0)[0]) * 16 + a_at(ln, r, 0)[1]) for ln in range(32)])
        for r in range(2):  # B: W's fp32 (slot, class), LDS.32, then split by every lane
            for h in range(2):
                n["partials now"] += waves([4 * ((b_at(ln, r, 0)[0] + h) * 16 + 8 * nt
                                                 + b_at(ln, r, 0)[1]) for ln in range(32)])
        for sw in (False, True):  # A: ldmatrix.x4; B: W·2⁸'s pieces [16][16] fp16, .x4.trans
            key = "partials ldmatrix" + (" swizzled" if sw else "")
            for m in range(4):
                rows = [16 * mt + 8 * (m & 1) + j for j in range(8)]
                n[key] += waves(ldsm_rows(rows, m >> 1, sw))
                n[key] += waves(ldsm_rows([8 * (m & 1) + j for j in range(8)], nt, sw))
    return dict(n)


def ldmatrix(mem: np.ndarray, row_addr: list[list[int]], trans: bool) -> np.ndarray:
    """[32 lanes][4 regs][2 halves]: mem is flat fp16 in halves; row_addr[m][j] its row's start."""
    out = np.zeros((32, 4, 2), mem.dtype)
    for ln in range(32):
        for m in range(4):
            for h in range(2):
                r, c = (2 * (ln % 4) + h, ln // 4) if trans else (ln // 4, 2 * (ln % 4) + h)
                out[ln, m, h] = mem[row_addr[m][r] + c]
    return out


def check_fragments(seed: int = 0) -> int:
    """Every fragment the proposal's ldmatrix loads equals the current code's; returns the count."""
    rng = np.random.default_rng(seed)
    checked = 0
    for sw in (False, True):
        x = rng.integers(0, 256, (BMAX, 16)).astype(np.float16)  # a ring slot, [i][slot]
        gp = rng.standard_normal((2, BMAX, 16)).astype(np.float16)  # G' hi, lo: [i][class]
        wp = rng.standard_normal((2, 16, 16)).astype(np.float16)  # W·2⁸ hi, lo: [slot][class]

        def lay(a: np.ndarray, sw: bool = sw) -> np.ndarray:  # [rows][16] into the flat layout
            flat = np.zeros(a.size, a.dtype)
            for i in range(a.shape[0]):
                for c in range(16):
                    flat[half_at(i, c, sw)] = a[i, c]
            return flat

        xs, gs, ws = lay(x), [lay(p) for p in gp], [lay(p) for p in wp]
        for u in range(8):
            nt, kq = u & 1, u >> 1
            for ks in range(2):
                i0 = 32 * kq + 16 * ks
                a = ldmatrix(xs, [[half_at(i0 + 8 * (m >> 1) + j, 8 * (m & 1), sw)
                                   for j in range(8)] for m in range(4)], True)
                both = np.concatenate([gs[0], gs[1]])
                b = ldmatrix(both, [[(m >> 1) * BMAX * 16
                                     + half_at(i0 + 8 * (m & 1) + j, 8 * nt, sw)
                                     for j in range(8)] for m in range(4)], True)
                for ln in range(32):
                    for r in range(4):
                        for h in range(2):
                            f, i = a_at(ln, r, h)
                            assert a[ln, r, h] == x[i0 + i, f]
                    for r in range(2):
                        for h in range(2):
                            k, c = b_at(ln, r, h)
                            assert b[ln, r, h] == gp[0][i0 + k, 8 * nt + c]
                            assert b[ln, 2 + r, h] == gp[1][i0 + k, 8 * nt + c]
                checked += 1
        for w in range(16):
            mt, nt = w & 7, w >> 3
            a = ldmatrix(xs, [[half_at(16 * mt + 8 * (m & 1) + j, 8 * (m >> 1), sw)
                               for j in range(8)] for m in range(4)], False)
            both = np.concatenate([ws[0], ws[1]])
            b = ldmatrix(both, [[(m >> 1) * 256 + half_at(8 * (m & 1) + j, 8 * nt, sw)
                                 for j in range(8)] for m in range(4)], True)
            for ln in range(32):
                for r in range(4):
                    for h in range(2):
                        i, f = a_at(ln, r, h)
                        assert a[ln, r, h] == x[16 * mt + i, f]
                for r in range(2):
                    for h in range(2):
                        f, c = b_at(ln, r, h)
                        assert b[ln, r, h] == wp[0][f, 8 * nt + c]
                        assert b[ln, 2 + r, h] == wp[1][f, 8 * nt + c]
            checked += 1
    return checked


def check_byte_to_half() -> None:
    """fp16(b) for a byte b as (0x6400 | b) − 1024 (1024 + b has ulp 1 in [1024, 2048)): exact."""
    b = np.arange(256, dtype=np.uint16)
    via = ((0x6400 | b).view(np.float16) - np.float16(1024)).astype(np.float16)
    assert np.array_equal(via, b.astype(np.float16)), "byte → fp16 trick not exact"


if __name__ == "__main__":
    for k, v in wavefront_counts().items():
        print(f"{k:28s} {v:5d} wavefronts a step (SM-wide)")
    print("fragments equal to the current loads:", check_fragments(), "warp-loads (both layouts)")
    check_byte_to_half()
    print("byte → fp16 via 0x6400 | b − 1024: exact for all 256 bytes")
