#!/bin/sh
# Issue 10's evidence on a GPU machine, in one command, from the repository root:
#   sh benchmarks/fast_rows_gpu_run.sh
# 1. the GPU tests of torch-graphs, triton-fused and cuda-epoch (and of torch-naive /
#    torch-optimized on CUDA): weights after one step against float64 autograd, every cuda-epoch
#    variant, one launch per epoch (profiler), 20 epochs of MNIST within 0.5 points of numpy-cpu;
# 2. the floor: barrier costs and the cuda-epoch variants (benchmarks/sync_cost.py), as JSON;
# 3. `fasttrain bench` (every row), its JSON and PNG under benchmarks/results/, named by date and GPU.
# Needs MNIST under $FASTTRAIN_DATA/mnist (or ~/.cache/fasttrain/mnist); nvcc on PATH or in
# /usr/local/cuda.
set -eu
export PYTHONPATH=src
PY=${PYTHON:-python}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')
stem=benchmarks/results/$(date -u +%Y-%m-%d)-$gpu
tests=0
if $PY -c "import pytest" 2>/dev/null; then
    # A failing test does not stop the measurements; the script's exit status reports it.
    $PY -m pytest -q -rs tests/ladder/test_cuda_epoch.py tests/ladder/test_torch_rows_cuda.py \
        tests/ladder/test_torch_graphs.py tests/ladder/test_triton_fused.py \
        tests/ladder/test_ladder.py || tests=$?
else
    echo "pytest is not installed here: GPU tests NOT run" >&2
    tests=1
fi
$PY benchmarks/sync_cost.py --json "$stem-sync-cost.json"
$PY -m fasttrain bench --no-progress --json "$stem.json" --plot "$stem.png"
exit $tests
