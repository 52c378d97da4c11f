#!/bin/bash
# session 21's GPU call (one loan of 15 minutes, so one call): cuda-epoch's candidates v7g-v7m in
# one launch, their GPU tests and their 20-epoch times against the row's v7f (gpu-check's v7-tests
# and v7-candidates); pick.py (this folder) names the fastest that passed, if it beats f, and the
# bench then runs with it as cuda_epoch.V7_VARIANT; then torch.compile's sweep in the time left.
export PYTHONPATH=src:. FASTTRAIN_DATA=.data PYTHONUNBUFFERED=1
D=benchmarks/results/gpu-calls-2026-11-28-h200-run10
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
python3 scripts/gpu-check /tmp/gc1 --only env,v7-tests,v7-candidates --budget 330
echo "gc1 rc=$? after $(el) s"
cp /tmp/gc1/pytest-v7.xml /tmp/gc1/results/*-v7-candidates.json $OUT/
W=$(python3 $D/pick.py /tmp/gc1 f)
echo "winner: '${W}' after $(el) s"
if [ -n "$W" ]; then
  sed -i "s/^V7_VARIANT = \"f\"/V7_VARIANT = \"$W\"/" src/fasttrain/ladder/cuda_epoch.py
  sed -i "s/^V7_ROW = \"f\"/V7_ROW = \"$W\"/" scripts/gpu-check
  grep -n "^V7_VARIANT\|^V7_ROW" src/fasttrain/ladder/cuda_epoch.py scripts/gpu-check
fi
python3 scripts/gpu-check /tmp/gc2 --only env,bench,compiled-sweep --budget $(( 565 - $(el) ))
echo "gc2 rc=$? after $(el) s"
cp /tmp/gc2/results/*.json /tmp/gc2/results/*.png $OUT/ 2>/dev/null
tar -czf $OUT/gc.tar.gz -C /tmp gc1 gc2
} > $OUT/call.log 2>&1
cut -c1-250 $OUT/call.log | grep -v "^gpu-check: .* (at most" | tail -120
