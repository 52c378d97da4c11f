"""What Inductor generates for torch_compiled's step and chunk on a GPU, read without one: the
same graphs lowered for CPU tensors by Inductor's Triton backend (`cpu_backend = "triton"`,
the scheduler and fusion rules its CUDA lowering uses), its code generated and never compiled
or run. Prints one JSON line: per compiled graph, the kernels its wrapper launches in order
(Triton kernels by name, extern calls as "extern:<op>").

What this cannot show: which GEMM max-autotune picks (its Triton templates are CUDA's only, so
mode stays default here) and the block sizes; a GPU test counts the kernels in the real graph.
Run in its own process (it patches Inductor and needs TRITON_INTERPRET=1 set before triton is
imported, which must not leak into other tests):

    TRITON_INTERPRET=1 python -m tests.ladder.inductor_triton_code step:FORM[:t] chunk:FORM:K ...
"""

from __future__ import annotations

import functools
import json
import re
import sys
from unittest import mock

import torch


def launches(wrapper: str) -> list[str]:
    """The kernels a generated wrapper's `call` launches, in order."""
    body = wrapper[wrapper.index("def call(self, args)"):]
    out = []
    for line in body.splitlines():
        if m := re.match(r"\s*(triton_\w+)\.run\(", line):
            out.append(m.group(1))
        elif m := re.match(r"\s*extern_kernels\.(\w+)\(", line):
            out.append(f"extern:{m.group(1)}")
    return out


def generated(fn, *args) -> list[list[str]]:
    """Calls torch.compile'd `fn` on CPU `args` with Inductor's Triton backend targeting sm_90
    code generation; returns each graph's launches. Nothing is compiled or run: the call is a
    no-op."""
    import torch.utils._triton as torch_triton
    from torch._inductor import config
    from torch._inductor.graph import GraphLowering
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    codes = []

    class NoOp:
        def call(self, args):
            args.clear()
            return ()

    def compile_to_module(self):
        wrapper, _ = self.codegen()
        codes.append(wrapper.value)
        return NoOp()

    backend = functools.cache(lambda: make_backend(GPUTarget("cuda", 90, 32)))
    with (mock.patch.object(torch_triton, "triton_backend", backend),
          mock.patch.object(GraphLowering, "compile_to_module", compile_to_module),
          config.patch(cpu_backend="triton", force_disable_caches=True)):
        torch._dynamo.reset()
        try:
            fn(*args)
        except Exception:  # the no-op graph returns nothing; codes already holds the code
            if not codes:
                raise
    return [launches(c) for c in codes]


def main(specs: list[str]) -> None:
    """Each spec "step:FORM" (a step on a full batch; "step:FORM:t" with W over [785, 10]
    storage, torch-graphs' transposed variants), "chunk:FORM:K" (K full batches) or "lagged:L"
    (torch_lagged's fused block of L full batches)."""
    from fasttrain.ladder import torch_compiled as tc

    rows = torch.rand(1024, 800)
    w = torch.randn(10, 785) * 0.01
    out = {}
    for spec in specs:
        what, form, *k = spec.split(":")
        if what == "step":
            fn = tc.compiled(tc.STEP[form])
            wt = w.T.contiguous().T if k == ["t"] else w
            graphs = generated(fn, rows[128:256], wt, tc.step_output(form, 1024, "cpu")[128:256],
                               0.1)
        elif what == "lagged":  # "lagged:L": torch_lagged's fused block of L full batches
            from fasttrain.ladder.torch_lagged import block_fused

            m = 128 * int(form)
            pix = torch.randint(0, 256, (m, 792)).float()
            graphs = generated(tc.compiled(block_fused), rows[:m], pix @ pix.T,
                               torch.zeros(m, 10), w,
                               torch.empty(m), 0.1, 128, m)
        else:
            fn = tc.compiled(tc.CHUNK[form])
            idx = torch.arange(128 * int(k[0]))
            graphs = generated(fn, idx, rows, w, torch.zeros(()), 0.1, 128)
        out[spec] = graphs
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
