"""The phase profiles of the `cuda-epoch` kernels (`cuda_epoch.EpochKernel.phase_profile` and
`.v7_phase_profile`): which phases each version's profiling build clocks, per role, and how v7's
per-CTA clocks become µs a step. The names here must match the kernels' own (csrc/epoch_v4.cuh's
Phase, csrc/epoch_v7_phases.cuh); the library's phase shape is checked against them at run time.
"""

from __future__ import annotations

import torch

V7_CTAS = 8  # v7's `ctas`: its chain cluster (the launch holds 64: 7 worker clusters more)
V7_HELPERS = ("c", "d", "e", "f", "g", "h", "i", "j", "k", "m", "n")
"""The variants whose chain CTAs split into critical and helper warps (v7c's chain and v7g's): their
phase profile has a third role, "helpers"."""
PHASES = ("partials", "widen", "wait partials", "softmax, send g", "wait g", "update")
"""A v4, v5 or v6 step's phases, in order (epoch_v4.cuh's Phase): the partial logits and their
sends; the next batch's widening; the wait for my rows' partials; their softmax and the g sends; the
wait for every row's g; the weight gradient and update."""
V7_PHASES = {
    "chain": ("wait G", "wait partials", "Gram terms", "logits", "softmax", "send G", "publish",
              "wait Γ"),
    "workers": ("load x", "wait G", "update", "partials", "cluster barrier", "reduce", "publish"),
    "helpers": ("wait G", "terms", "wait partials", "wait Γ", "Γ loads", "lane sum", "labels",
                "hand-off"),
}
"""v7's phases a role, in the order a step runs them (csrc/epoch_v7_phases.cuh): the chain CTA waits
for G_{t-1} and for the worker clusters' counters, adds the bias and the Gram term j = 1, reads the
partials into Z_t, takes the softmax, sends G_t, releases its counter and adds the next step's Gram
terms j >= 2 (counted as "Gram terms"); "wait Γ" is its wait for the producers' flag of the
next step's Grams before it loads them (one launch, `v7_grams="launch"`; ~0 in two launches, where
it waits for nothing); a worker CTA issues the loads of x_{t+1}, waits for the
chain's counters and applies the lagged updates, computes its partial logits (and stores x_{t+1}),
passes the cluster barrier, reduces its rows over DSMEM and releases its counter. v7b keeps the
names: "wait partials" is its poll of the tagged words (the data come with their tags), "logits" the
Gram terms' lane sums and the bias added in registers, "softmax" the 16-lane shuffles; its workers'
"reduce" ends with the tagged stores and "publish" is empty (no counter: the tags are the
signal). v7c's chain (its thread 0 is a critical warp's) keeps them too: "Gram terms" is b_t, the
term j = 1 with its lane shuffles and the wait at the hand-off barrier for the helper warps (their
own work, off the critical path, is not timed): a long one says the helpers are late; nothing
follows the publish. v7d's workers keep them too: "wait G" is empty when the update's G was fetched
ahead (else the poll and the loads), "update" starts by storing the fetched G into shared memory,
and "partials" includes the fetching warps' non-blocking check and the issue of their loads.
v7e's workers (v7d's loop on the tensor cores) keep them: "update" starts by turning the fetched G
into G''s fp16 pieces, then the mma sums (warps 0-7) and the apply; "partials" is every warp's
m16 x n8 tile of P_t, x_{t+1}'s halves and the next G's fetch. v7f's (no cluster barrier in its
loop): "partials" includes the wait for the inbox slot's credits and the st.async sends, "cluster
barrier" is the wait for step t - 1's tiles in my inbox, "reduce" their sums, the tagged stores and
the credits back.
The helpers (V7_HELPERS' chain CTAs' warps 8-15, clocked by their first thread, tid 256, rows of
their own) make step t + 1's terms j >= 2 during the chain's step t: the try_wait for G_{t-1}, the
terms, v7g's check (else poll) of P_{t+1}'s tags, the producers' flag of Γ_{t+2} ("wait Γ"), the
issue of its loads, the 16-lane sums into shared memory, step t + 1's labels (v7c: two dependent
loads) and the hand-off barrier (their wait for the critical warps). v7g's chain keeps the
chain's names, in another order: "wait G", "Gram terms" (b_t, the term j = 1 and its lane sums:
no wait), "wait partials" (the hand-off: its wait for the helpers, who bring P_t and the terms
j >= 2), "logits" (Γ_{t+1,1}'s loads issued, Z), then softmax, send G, publish; no "wait Γ" (the
helpers' flag check covers Γ_{t+1,1} through the hand-off barrier)."""
V7_UNTIMED = {v: {"chain": ("wait Γ",), "helpers": ("wait partials",)}
              for v in ("c", "d", "e", "f")}
V7_UNTIMED["g"] = V7_UNTIMED["h"] = V7_UNTIMED["i"] = V7_UNTIMED["j"] = V7_UNTIMED["k"] = {
    "chain": ("wait Γ",)}
V7_UNTIMED["m"] = V7_UNTIMED["n"] = V7_UNTIMED["j"]
"""Phases a variant's profiling build does not clock, so they read 0: v7c's chain (v7d-v7f's)
counts its wait for the producers' flag inside "Gram terms" (a separate clock mark spilled v7c's
timed one-launch build). The H200's run 5 (2026-11-28) found them 0 in both launch modes. v7c's
helpers poll no partials; v7g's chain (v7h's … v7m's) waits for no flag of the producers.
v7i's (and v7j's, v7k's, v7m's) chain publishes nothing (its helpers do): its "publish" is one
bar.arrive, ~0 but clocked. v7m's chain sends each warp's rows right after its softmax: its
"softmax" (thread 0's, warp 0's) ends with its rows in gl, "send G" holds warp 0's sends, its wait
for the other warps' rows (barrier 1), the column sums and their sends; the loss after "publish"
lands in "wait G". v7n's chain sends no column sums: its "softmax" ends with warp 0's rows in gl,
"send G" is warp 0's row sends and its tokens (no barrier), the loss after "publish" lands in "wait
G", and "Gram terms" holds no bias update; its helpers' "hand-off" holds the bias they make from
G_t's rows (warps 9-11: the wait for G_t, the column sums, a barrier) with v7i's store."""


def v7_phases_us(clocks: list[int], span: list[int], ctas: int, cols: int,
                 roles: tuple[str, ...] = ("chain", "workers")) -> dict:
    """v7's phase clocks as µs a step, per role of `roles` (V7_PHASES's, the helpers only for
    V7_HELPERS: other variants leave their rows 0): {role: {"step_us", "mean_us", "max_us",
    "clock_ghz"}}.

    clocks: [ctas][cols] (chain CTAs first, then the workers, then the chain CTAs' helper warps;
    a role's phases in its first columns), span: each row's loop in ns (globaltimer), then the
    steps. Each CTA's clocks become
    ns at its own rate (its clocks / its span, "clock_ghz": the role's mean, min and max), since
    SMs run at different clocks at once: on an H200 (2026-11-28, benchmarks/results/
    gpu-calls-2026-11-28-h200-run9) v7e's and v7f's tensor-core workers at 1.77-1.80 GHz while
    their chain ran at 1.93-1.97 (v7a's two launches: all at 1.97-1.98). At chain CTA 0's rate for
    every CTA, as this read them before, those workers' phases fell 7-11 % short of their loops.
    A CTA's phases cover its loop by construction (a mark's clock difference telescopes from the
    clock's start to the last mark), so a role's mean phases add up to its "step_us", the mean
    span a step."""
    per_cta = torch.tensor(clocks, dtype=torch.float64).view(ctas, cols)
    ns, steps = torch.tensor(span[:ctas], dtype=torch.float64), span[ctas]
    ticks = per_cta.sum(1)
    # 8 chain CTAs, 7 worker clusters of 8 CTAs, the 8 chain CTAs' helper warps
    rows = {"chain": slice(0, V7_CTAS), "workers": slice(V7_CTAS, 8 * V7_CTAS),
            "helpers": slice(8 * V7_CTAS, 9 * V7_CTAS)}
    missing = [i for role in roles for i in range(ctas)[rows[role]] if ns[i] <= 0 or ticks[i] <= 0]
    if steps <= 0 or missing:
        raise RuntimeError(f"cuda-epoch v7's phase profile: CTAs {missing} wrote no figures (a "
                           f"CTA that left early), steps {steps}")
    ghz = ticks / ns
    us = per_cta / ghz[:, None] / steps / 1e3
    out = {}
    for role in roles:
        names = V7_PHASES[role]
        part, rate = us[rows[role], :len(names)], ghz[rows[role]]
        out[role] = {"step_us": ns[rows[role]].mean().item() / steps / 1e3,
                     "mean_us": dict(zip(names, part.mean(0).tolist(), strict=True)),
                     "max_us": dict(zip(names, part.max(0).values.tolist(), strict=True)),
                     "clock_ghz": {"mean": rate.mean().item(), "min": rate.min().item(),
                                   "max": rate.max().item()}}
    return out
