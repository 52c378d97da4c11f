#!/bin/bash
# session 15's GPU call: v7a tests, sync_cost, then the bench with v7 if it passes and wins.
export PYTHONPATH=src FASTTRAIN_DATA=.data
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
TESTS="tests/ladder/test_cuda_epoch.py tests/ladder/test_cuda_epoch_v7_phases.py tests/ladder/test_sync_probes.py"
timeout 200 python3 -m pytest -m gpu $TESTS -k "v7 or probe" -v -p no:cacheprovider > $OUT/v7-tests.log 2>&1
TRC=$?; echo "tests rc=$TRC after $(( $(date +%s) - T0 )) s"; tail -30 $OUT/v7-tests.log
if [ $TRC -ne 0 ] && grep -qi "cooperative\|TooLarge\|NotSupported\|not supported" $OUT/v7-tests.log; then
  echo "retry without the cooperative attribute"
  sed -i 's/v7_config(attr, true, stream)/v7_config(attr, false, stream)/' src/fasttrain/ladder/csrc/epoch_v7_launch.cuh
  timeout 150 python3 -m pytest -m gpu $TESTS -k "v7 or probe" -v -p no:cacheprovider > $OUT/v7-tests-noncoop.log 2>&1
  TRC=$?; echo "noncoop tests rc=$TRC after $(( $(date +%s) - T0 )) s"; tail -30 $OUT/v7-tests-noncoop.log
fi
timeout 150 python3 benchmarks/sync_cost.py --epochs 10 --json $OUT/sync-cost.json > $OUT/sync-cost.log 2>&1
echo "sync_cost rc=$? after $(( $(date +%s) - T0 )) s"; cat $OUT/sync-cost.log | tail -60
timeout 60 python3 v7_kernels.py > $OUT/v7-kernels.log 2>&1; echo "kernels rc=$?"; cat $OUT/v7-kernels.log | tail -14
WIN=$(python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/sync-cost.json"))["cuda_epoch_ms"]
v6 = min(v for k, v in d.items() if k.startswith("v6") and isinstance(v, float))
v7 = [v for k, v in d.items() if k.startswith("v7") and isinstance(v, float)]
print("yes" if v7 and min(v7) < v6 else "no")
PY
)
echo "v7 wins: $WIN (tests rc=$TRC)"
timeout 120 python3 benchmarks/engine_overhead.py --against hand-indexed --model mlp --batch-size 128 --threads 1 --ops --device cuda --rounds 21 --window 50 --json $OUT/engine-overhead.json > $OUT/engine-overhead.log 2>&1; echo "overhead rc=$? after $(( $(date +%s) - T0 )) s"; tail -25 $OUT/engine-overhead.log
timeout 150 python3 benchmarks/peers_in_memory.py --device cuda --models mlp --rounds 2 --max-seconds 140 --json $OUT/peers-in-memory.json > $OUT/peers.log 2>&1; echo "peers rc=$? after $(( $(date +%s) - T0 )) s"; tail -25 $OUT/peers.log
LEFT=$(( 520 - ($(date +%s) - T0) ))
if [ "$WIN" = yes ] && [ $TRC -eq 0 ] && [ $LEFT -gt 100 ]; then
  sed -i 's/^VERSION = 6 /VERSION = 7 /' src/fasttrain/ladder/cuda_epoch.py
  grep -n "^VERSION" src/fasttrain/ladder/cuda_epoch.py
  python3 scripts/gpu-check $OUT/gc --only env,bench --budget $(( LEFT - 10 ))
  echo "gpu-check rc=$? after $(( $(date +%s) - T0 )) s"
fi
