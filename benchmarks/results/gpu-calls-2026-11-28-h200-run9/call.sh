#!/bin/bash
# session 18's fourth GPU call (the loan's last ~6 minutes): the v8 chain probe with its phase build's
# softmax split (wait_inputs: the step's P+Q and labels arriving, then the softmax proper), and
# phase_rates.py (this folder): each v7 CTA's clocks per ns over its phase-profile span.
export PYTHONPATH=src:. FASTTRAIN_DATA=.data PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
timeout 120 python3 benchmarks/v8_probes.py --json $OUT/v8-probes.json 2>&1 | grep -v "Warn\|from_numpy"
echo "v8_probes after $(el) s"
timeout 100 python3 benchmarks/results/gpu-calls-2026-11-28-h200-run9/phase_rates.py 2>&1 | tee $OUT/phase-rates.log
echo "phase_rates after $(el) s"
