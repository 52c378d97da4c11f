// Where cpp-tiled's epoch goes: the row's own code (csrc/cpu_epoch.cpp, included), its threads
// timed phase by phase over a 60,000-sample epoch of random pixels (the arithmetic does not
// depend on the values). Prints each thread's milliseconds per phase and the epoch's wall time,
// for REPS epochs; read the fastest (the machine may be shared).
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

struct Phases {
    double labels = 0, forward = 0, barrier = 0, softmax = 0, update = 0;
};

// Worker::run with a clock between the phases.
static void timed_run(Worker& me, Shared& sh, Phases& p) {
    long generation = 0;
    for (int64_t start = 0, step = 0; start < sh.n; start += sh.batch, step++) {
        int nb = (int)std::min<int64_t>(sh.batch, sh.n - start);
        int64_t next = start + nb;
        int next_nb = (int)std::min<int64_t>(sh.batch, sh.n - next);
        float* zp = sh.zp + (step & 1) * sh.n_threads * CLASSES * sh.bpv;
        double t0 = now_ms();
        me.labels(sh.order + start, nb);
        double t1 = now_ms();
        me.forward(sh.order + start, nb, zp + me.t * CLASSES * sh.bpv);
        double t2 = now_ms();
        barrier(sh.flags, me.t, sh.n_threads, ++generation);
        double t3 = now_ms();
        me.softmax(nb, zp);
        double t4 = now_ms();
        me.update(nb, sh.order + next, next_nb);
        double t5 = now_ms();
        p.labels += t1 - t0, p.forward += t2 - t1, p.barrier += t3 - t2;
        p.softmax += t4 - t3, p.update += t5 - t4;
    }
}

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
    const int bpv = logits_stride(B), bt = round_up(B, TS), nch = K / VW;
    printf("vector width %d, %d threads, ms per epoch\n", VW, T);
    for (int rep = 0; rep < reps; rep++) {
        float* zp = alloc<float>((size_t)2 * T * CLASSES * bpv);
        Flag* flags = new Flag[T];
        Shared sh{x.data(), y.data(), order.data(), N, K, B, bpv, T, 0.1f, w.data(), b.data(),
                  zp, flags, 0.0};
        std::vector<Phases> phases(T);
        auto body = [&](int t) {
            int c0 = nch * t / T, c1 = nch * (t + 1) / T, ks = (c1 - c0) * VW;
            Worker me{sh, t, c0 * VW, ks, c1 - c0, alloc<float>((size_t)CLASSES * ks),
                      alloc<float>((size_t)bt * ks), alloc<float>((size_t)CLASSES * bpv),
                      alloc<int32_t>(bpv), {}};
            timed_run(me, sh, phases[t]);
            free(me.w), free(me.xf), free(me.g), free(me.lab);
        };
        double t0 = now_ms();
        std::vector<std::thread> others;
        for (int t = 1; t < T; t++) others.emplace_back(body, t);
        body(0);
        for (auto& th : others) th.join();
        printf("epoch %.2f:", now_ms() - t0);
        for (int t = 0; t < T; t++)
            printf("  [t%d forward %.2f barrier %.2f softmax %.2f update %.2f labels %.2f]", t,
                   phases[t].forward, phases[t].barrier, phases[t].softmax, phases[t].update,
                   phases[t].labels);
        printf("\n");
        free(zp);
        delete[] flags;
    }
}
