// Where cpp-tiled's epoch goes: the row's own code (csrc/cpu_epoch.cpp, included), its threads'
// own loop (Worker::run) with a clock between the phases, over a 60,000-sample epoch of random
// pixels (the arithmetic does not depend on the values). Prints the epoch's wall time and each
// thread's milliseconds per phase, for REPS epochs; read the fastest (the machine may be shared).
//
//   g++ -O3 -march=native -std=c++17 -pthread -ffp-contract=fast -o /tmp/phases
//       benchmarks/cpu_epoch_phases.cpp && /tmp/phases [threads] [reps]
//
// (add -mno-avx512f for the AVX2 build). The clock reads cost ~0.1 ms an epoch.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "../src/fasttrain/ladder/csrc/cpu_epoch.cpp"

static double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

constexpr const char* PHASES[] = {"labels", "forward", "barrier", "softmax", "update"};

// Milliseconds a thread spent in each phase of Worker::run, summed over the epoch.
struct PhaseClock {
    double ms[5] = {}, last = now_ms();
    void operator()(int phase) {
        double t = now_ms();
        ms[phase] += t - last;
        last = t;
    }
};

int main(int argc, char** argv) {
    const int N = 60000, K = 784, B = 128;
    int T = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
    std::vector<uint8_t> x((size_t)N * K);
    std::vector<int64_t> y(N), order(N);
    std::mt19937 rng(1);
    for (auto& v : x) v = rng() & 255;
    for (int i = 0; i < N; i++) y[i] = rng() % CLASSES, order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<float> w(CLASSES * K), b(CLASSES);
    for (auto& v : w) v = (rng() % 1000) * 1e-5f;
    printf("vector width %d, %d threads, ms per epoch\n", VW, T);
    for (int rep = 0; rep < reps; rep++) {
        Shared sh{x.data(), y.data(), order.data(), N, K, B, 0, T, 0.1f, w.data(), b.data(),
                  nullptr, nullptr};
        std::vector<PhaseClock> clocks(T);
        double loss, t0 = now_ms();
        // (the library's own epoch: only the hooks differ)
        if (train_epoch(sh, &loss, [&](int t) -> PhaseClock& {
                clocks[t].last = now_ms();
                return clocks[t];
            })) {
            printf("out of memory\n");
            return 1;
        }
        printf("epoch %.2f:", now_ms() - t0);
        for (int t = 0; t < T; t++) {
            printf("  [t%d", t);
            for (int i = 0; i < 5; i++) printf(" %s %.2f", PHASES[i], clocks[t].ms[i]);
            printf("]");
        }
        printf("\n");
    }
}
