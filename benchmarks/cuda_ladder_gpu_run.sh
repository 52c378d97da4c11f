#!/bin/sh
# The CUDA C++ ladder's evidence on a GPU machine, in one command, from the repository root:
#   sh benchmarks/cuda_ladder_gpu_run.sh
# 1. the GPU tests of the CUDA rungs (every rung against float64 autograd, host-sync counts, graph
#    replay, and the 20-epoch MNIST accuracy within 0.5 points of numpy-cpu);
# 2. `fasttrain bench` (every row), its JSON and PNG under benchmarks/results/, named by date and GPU;
# 3. where a step's time goes in each CUDA rung (torch profiler), as JSON beside them.
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
    $PY -m pytest -q -rs tests/ladder/test_build.py tests/ladder/test_cuda_rungs.py \
        tests/ladder/test_ladder.py || tests=$?
else
    echo "pytest is not installed here: GPU tests NOT run" >&2
    tests=1
fi
$PY -m fasttrain bench --no-progress --json "$stem.json" --plot "$stem.png"
$PY benchmarks/cuda_step_profile.py --json "$stem-cuda-profile.json"
exit $tests
