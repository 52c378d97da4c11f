#!/bin/bash
# session 18's third GPU call: the phase clocks read by a volatile asm (run 7: v7e's and v7f's
# workers' sums missed 7-11 % of their spans with clock()); v7f's and v7e's GPU tests again; sync_cost
# for v7c/e/f in one launch; then the bench with the row's new kernel, v7f in one launch.
export PYTHONPATH=src FASTTRAIN_DATA=.data PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 180 python3 -m pytest -m gpu tests/ladder/test_cuda_epoch_v7_phases.py tests/ladder/test_cuda_epoch.py \
  -k "phases or v7e or v7f" -v -p no:cacheprovider -rf > $OUT/tests.log 2>&1
echo "tests rc=$? after $(el) s"
grep -E "^(FAILED|ERROR)" $OUT/tests.log | sed 's/.*:://' | head -40; tail -1 $OUT/tests.log
grep -E "^E  " $OUT/tests.log | cut -c1-200 | head -30
timeout 100 python3 benchmarks/sync_cost.py --epochs 20 --versions 6,7 --v7 c:launch,e:launch,f:launch \
  --json $OUT/sync-cost.json
echo "sync_cost rc=$? after $(el) s"
} > $OUT/run.log 2>&1
cut -c1-300 $OUT/run.log
grep -n "^VERSION\|^V7_VARIANT\|^V7_GRAMS_DEFAULT" src/fasttrain/ladder/cuda_epoch.py
python3 scripts/gpu-check $OUT/gc --only env,bench --compact --budget $(( 420 - $(el) ))
echo "gpu-check rc=$? after $(el) s"; tail -14 $OUT/gc/summary.md
