#!/bin/bash
# session 16's GPU call 3: v7a/b/c/d GPU tests, then sync_cost (v2-v6, v7a, v7b, v7c, Grams v1/v2).
export PYTHONPATH=src FASTTRAIN_DATA=.data
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
TESTS="tests/ladder/test_cuda_epoch.py tests/ladder/test_cuda_epoch_v7_phases.py"
timeout 200 python3 -m pytest -m gpu $TESTS -k "v7" -v -p no:cacheprovider > $OUT/v7-tests.log 2>&1
TRC=$?; echo "tests rc=$TRC after $(el) s"; grep -E "PASSED|FAILED|ERROR" $OUT/v7-tests.log | sed 's/.*:://' | head -60; tail -5 $OUT/v7-tests.log
grep -B5 -A40 "^___" $OUT/v7-tests.log | head -120
timeout 200 python3 benchmarks/sync_cost.py --epochs 10 --json $OUT/sync-cost.json > $OUT/sync-cost.log 2>&1
echo "sync_cost rc=$? after $(el) s"; grep -A3 "v6, cluster of 14\|v7" $OUT/sync-cost.log
