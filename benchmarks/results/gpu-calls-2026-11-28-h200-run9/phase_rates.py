"""Run 9's diagnostic (session 18): each v7 CTA's clock rate over its phase-profile span, to see
where the workers' phase sums of a (one launch), e and f part from their spans (runs 6-8: by
6-11 %, the chains and the other variants within 1 %). Prints, per variant, the chain CTAs' and
the worker CTAs' clocks per ns (their phase clocks summed / their globaltimer span), by cluster."""
import statistics
import sys

from tests.conftest import tiny_images

from fasttrain.ladder import cuda_epoch as ce
from fasttrain.ladder.common import LadderConfig, make_ladder_data

raw = {}
original = ce.v7_phases_us


def capture(clocks, span, ctas, cols):
    raw.update(clocks=list(clocks), span=list(span), ctas=ctas, cols=cols)
    return original(clocks, span, ctas, cols)


ce.v7_phases_us = capture
cfg = LadderConfig(epochs=1, batch_size=128)
data = make_ladder_data(tiny_images(n_train=128 * 40), cfg)
for spec in sys.argv[1:] or ["c:launch", "a:kernel", "a:launch", "e:kernel", "e:launch",
                             "f:launch"]:
    variant, grams = spec.split(":")
    k = ce.EpochKernel(data, cfg, version=7, v7_variant=variant, v7_grams=grams)
    for rep in range(2):
        k.phase_profile(0)
        ctas, cols = raw["ctas"], raw["cols"]
        rate = [sum(raw["clocks"][i * cols:(i + 1) * cols]) / raw["span"][i] for i in range(ctas)]
        chain, workers = rate[:ce.V7_CTAS], rate[ce.V7_CTAS:]
        by_cluster = [statistics.median(workers[c:c + 8]) for c in range(0, len(workers), 8)]
        print(f"v7{variant} {grams} #{rep}: clocks/ns chain {min(chain):.3f}-{max(chain):.3f}; "
              f"workers {min(workers):.3f}-{max(workers):.3f} (median "
              f"{statistics.median(workers):.3f}); by worker cluster "
              + " ".join(f"{r:.3f}" for r in by_cluster)
              + f"; spans µs chain0 {raw['span'][0] / 1e3:.1f}, workers "
              f"{min(raw['span'][ce.V7_CTAS:ctas]) / 1e3:.1f}-"
              f"{max(raw['span'][ce.V7_CTAS:ctas]) / 1e3:.1f}", flush=True)
