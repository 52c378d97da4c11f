#!/bin/bash
# session 18's GPU call: session 17's CPU-checked work on its first loan. The v8 probes' and v7e/v7f's
# GPU tests, the probes' timings, sync_cost for v7c/d (one launch) against v7e/v7f; then, if v7e or
# v7f beats v7c in one launch and its tests passed, the bench with it as the row.
export PYTHONPATH=src FASTTRAIN_DATA=.data PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
LOG=$OUT/run.log
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
TESTS="tests/ladder/test_v8_workers.py tests/ladder/test_v8_chain.py tests/ladder/test_v8_helpers.py
 tests/ladder/test_cuda_epoch.py tests/ladder/test_cuda_epoch_v7_phases.py
 tests/ladder/test_cuda_epoch_v7_grams.py tests/ladder/test_gram_v2.py"
timeout 210 python3 -m pytest -m gpu $TESTS -k "v7 or v8 or gram" -v -p no:cacheprovider -rf > $OUT/tests.log 2>&1
TRC=$?; echo "tests rc=$TRC after $(el) s"
grep -E "FAILED|ERROR" $OUT/tests.log | sed 's/.*:://' | head -40; tail -3 $OUT/tests.log
grep -B5 -A25 "^___" $OUT/tests.log | grep -E "^E |^___|Error" | head -60
timeout 100 python3 benchmarks/v8_probes.py --json $OUT/v8-probes.json
echo "v8_probes rc=$? after $(el) s"
timeout 140 python3 benchmarks/sync_cost.py --epochs 10 --versions 6,7 --v7 c:launch,d:launch,e,f \
  --json $OUT/sync-cost.json
echo "sync_cost rc=$? after $(el) s"
} > $LOG 2>&1
cat $LOG | cut -c1-400
BEST=$(python3 - <<'PY'
import json, os
try:
    d = json.load(open(os.environ["OUT"] + "/sync-cost.json"))["cuda_epoch_ms"]
except Exception:
    print("none"); raise SystemExit
c = [v for k, v in d.items() if k.startswith("v7c in one launch") and isinstance(v, float)]
new = sorted((v, k[2], "launch" if "one launch" in k else "kernel")
             for k, v in d.items() if k[:3] in ("v7e", "v7f") and isinstance(v, float))
print(f"{new[0][1]} {new[0][2]}" if c and new and new[0][0] < c[0] else "none")
PY
)
echo "best of v7e/v7f beating v7c in one launch: $BEST"
LEFT=$(( 560 - $(el) ))
if [ "$BEST" != none ] && [ -n "$BEST" ] && [ $LEFT -gt 110 ]; then
  set -- $BEST
  if grep -E "FAILED.*(v7$1|\[$1-)" $OUT/tests.log; then echo "v7$1 failed a test: no bench"; exit 0; fi
  sed -i "s/^V7_VARIANT = \"c\"/V7_VARIANT = \"$1\"/" src/fasttrain/ladder/cuda_epoch.py
  sed -i "s/^V7_GRAMS_DEFAULT = \"launch\"/V7_GRAMS_DEFAULT = \"$2\"/" src/fasttrain/ladder/cuda_epoch.py
  grep -n "^VERSION\|^V7_VARIANT\|^V7_GRAMS_DEFAULT" src/fasttrain/ladder/cuda_epoch.py
  python3 scripts/gpu-check $OUT/gc --only env,bench --compact --budget $(( LEFT - 10 ))
  echo "gpu-check rc=$? after $(el) s"; cat $OUT/gc/summary.md | tail -14
fi
