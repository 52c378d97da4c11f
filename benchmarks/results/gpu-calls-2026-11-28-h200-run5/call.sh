#!/bin/bash
# session 16's GPU call 5 (run 4 + the one-launch shared-memory fix): v7 a-d in two launches and in one (Gram producers in the launch): GPU
# tests, sync_cost; then, if every test passed and a v7 beats v6, the bench with it as the row.
export PYTHONPATH=src FASTTRAIN_DATA=.data
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
TESTS="tests/ladder/test_cuda_epoch.py tests/ladder/test_cuda_epoch_v7_phases.py tests/ladder/test_cuda_epoch_v7_grams.py"
timeout 240 python3 -m pytest -m gpu $TESTS -k "v7" -v -p no:cacheprovider > $OUT/v7-tests.log 2>&1
TRC=$?; echo "tests rc=$TRC after $(el) s"; grep -E "PASSED|FAILED|ERROR" $OUT/v7-tests.log | sed 's/.*:://' | head -80; tail -4 $OUT/v7-tests.log
grep -A30 "^___" $OUT/v7-tests.log | head -80
timeout 200 python3 benchmarks/sync_cost.py --epochs 10 --json $OUT/sync-cost.json > $OUT/sync-cost.log 2>&1
echo "sync_cost rc=$? after $(el) s"; grep -A3 "v6, cluster of 14\|v7" $OUT/sync-cost.log
BEST=$(python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/sync-cost.json"))["cuda_epoch_ms"]
v6 = min(v for k, v in d.items() if k.startswith("v6") and isinstance(v, float))
v7 = sorted((v, k[2], "launch" if "one launch" in k else "kernel")
            for k, v in d.items() if k.startswith("v7") and isinstance(v, float))
print(f"{v7[0][1]} {v7[0][2]}" if v7 and v7[0][0] < v6 else "none")
PY
)
echo "best v7 beating v6: $BEST (tests rc=$TRC)"
LEFT=$(( 345 - $(el) ))
if [ "$BEST" != none ] && [ -n "$BEST" ] && [ $TRC -eq 0 ] && [ $LEFT -gt 90 ]; then
  set -- $BEST
  sed -i 's/^VERSION = 6 /VERSION = 7 /' src/fasttrain/ladder/cuda_epoch.py
  sed -i "s/^V7_VARIANT = \"a\"/V7_VARIANT = \"$1\"/" src/fasttrain/ladder/cuda_epoch.py
  sed -i "s/^V7_GRAMS_DEFAULT = \"kernel\"/V7_GRAMS_DEFAULT = \"$2\"/" src/fasttrain/ladder/cuda_epoch.py
  grep -n "^VERSION\|^V7_VARIANT\|^V7_GRAMS_DEFAULT" src/fasttrain/ladder/cuda_epoch.py
  python3 scripts/gpu-check $OUT/gc --only env,bench --budget $(( LEFT - 10 ))
  echo "gpu-check rc=$? after $(el) s"
  grep -i "cuda-epoch" $OUT/gc/bench.log 2>/dev/null | head; ls $OUT/gc
fi
