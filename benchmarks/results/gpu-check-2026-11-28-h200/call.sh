#!/bin/bash
# session 16's GPU call 6: the bench with cuda-epoch v7c in one launch as the row (VERSION 7,
# V7_VARIANT "c", V7_GRAMS_DEFAULT "launch": run 5's fastest, 1.960 ms/epoch against v6's 2.036).
export PYTHONPATH=src FASTTRAIN_DATA=.data
python3 scripts/gpu-check $OUT/gc --only env,bench --budget 190
echo "gpu-check rc=$?"; grep -i "cuda-epoch\|torch-graphs\|triton-fused\|naive" $OUT/gc/bench.log | head -20; ls $OUT/gc $OUT/gc/* | head -30
