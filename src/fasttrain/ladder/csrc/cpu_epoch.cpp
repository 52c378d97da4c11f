// cpp-tiled: one epoch of the ladder's model (784→10 logistic regression, softmax cross-entropy,
// SGD) on the CPU's cores, written for the FMA units. Built on first use by g++ with
// -march=native (fasttrain/ladder/build.py), so the vector width is this machine's: 16 floats with
// AVX-512, 8 with AVX2, 4 otherwise. GCC's portable vector extensions; one intrinsic (widening).
//
// The work is split by FEATURES, not by samples: thread t owns a slice of the 784 inputs and the
// same slice of every weight row, for the whole epoch, in its own memory. Per step:
//
//   forward   partial logits of my features for every sample: tiles of (TS samples × 2
//             classes) accumulated along k, reduced across lanes by shuffle trees; the
//             first class pair widens my slice of the rows (uint8 → float32, kept for the rest)
//   barrier   the ONLY one of the step: partial logits are double-buffered by step parity
//   softmax   every thread, redundantly, over all samples (samples along the lanes), so the
//             gradient of the logits never has to cross cores
//   update    my weight slice += −lr/255 · dZᵀ·X, tiles of (5 classes × TKU chunks) accumulated
//             over the batch in registers: no gradient buffer, no reduction between cores
//   prefetch  the next step's rows (my slice of them), an even share before each update tile
//
// Pixels are widened without scaling (exact integers 0..255); 1/255 is folded into the logits and
// the update. fp32 throughout: the weights match the float64 reference to float32 rounding.
//
// Measured (MNIST, 20 epochs, 2-core AMD EPYC Zen 4 with AVX-512, fasttrain bench; the roofline
// there is 8.1 ms/epoch at 231 GFLOP/s): first version 25 ms/epoch; u8 → float widened by an
// intrinsic instead of GCC's lane-by-lane conversion 12.5; x kept in a register instead of
// folded into both of its FMAs (18 → 10 loads a tile step) and compile-time lane order in the
// shuffle tree, one thread alone: forward 6.4 → 4.5 ms; widening fused into the forward 11.6;
// tiny probabilities taken as 0 (see TINY): every epoch 11.4–11.9 instead of 11.5–42.
// Tried and slower: prefetching a line per sample inside the update tile (+30%), prefetching in
// the forward instead of the update (+5%), chunk-major widened rows (+6%), a 10 × 2 update tile
// (same). One thread's share at ~12 ms (benchmarks/cpu_epoch_phases.cpp, Zen 4, 2026-11-26):
// forward 5.1-5.4, update 5.2-5.4 (the FMAs alone: ~4.1 each), softmax 0.5, the barrier (the
// 384-feature thread waits 0.5 ms for the 400-feature one) and the labels the rest.

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <sched.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
constexpr int VW = 16;
#elif defined(__AVX__)
constexpr int VW = 8;
#else
constexpr int VW = 4;
#endif

constexpr int CLASSES = 10;
// Forward tile: TS samples × 2 classes, 16 accumulators with AVX-512's 32 registers, 12 with 16
// (AVX2: 12 measured ~2% faster than 8, which leaves the two FMA pipes' 8 slots no slack).
constexpr int TS = VW >= 16 ? 8 : 6;
constexpr int TILE = 2 * TS;
constexpr int TREES = (TILE + VW - 1) / VW;  // lane-reduction trees a tile needs
constexpr int TCU = 5;                    // update tile: 5 classes ...
constexpr int TKU = VW >= 16 ? 4 : 2;     // ... × TKU chunks of VW features (20 or 10 accumulators)
constexpr int SPINS_BEFORE_YIELD = 4000;  // a waiting core gives its slice away eventually
// Probabilities below this are taken as 0. Without it a confident model's softmax yields
// denormals (exp(−87)/Σ/nb), and every FMA of the update that touches one stalls: MNIST epochs
// varied 11.5–42 ms once the model was confident (now 11.4–11.9). Its effect on a gradient
// (< 1e-32) is far below fp32 rounding of the weights.
constexpr float TINY = 1e-30f;

typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
typedef float vf_u __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef uint8_t vb_u __attribute__((vector_size(VW), aligned(1), may_alias));

static inline vf load(const float* p) { return *reinterpret_cast<const vf_u*>(p); }
static inline void store(float* p, vf v) { *reinterpret_cast<vf_u*>(p) = v; }
// VW pixels → floats. GCC 12 widens a vector of bytes lane by lane, so the one instruction that
// does it is named where the machine has it (the only intrinsics in this file).
static inline vf widen(const uint8_t* p) {
#if defined(__AVX512F__)
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)));
#elif defined(__AVX2__)
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
#else
    return __builtin_convertvector(*reinterpret_cast<const vb_u*>(p), vf);
#endif
}
template <size_t... I>
static inline vf splat(float s, std::index_sequence<I...>) { return vf{((void)I, s)...}; }
static inline vf splat(float s) { return splat(s, std::make_index_sequence<VW>{}); }

static inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// ---- lane reduction: VW vectors in, one vector out whose lane L is the sum of input L's lanes --

// One level of the tree: each 2S-lane block of the result holds a's block folded (its two S-lane
// halves added) followed by b's. After log2(VW) levels input i sits in lane bitreverse(i).
constexpr int fold_lane(int s, int i) {
    return (i % (2 * s) < s ? 0 : VW) + i / (2 * s) * 2 * s + i % s;
}
#if defined(__clang__) || (__GNUC__ >= 12 && !defined(FASTTRAIN_OLD_SHUFFLE))
template <int S, size_t... I>
static inline vf fold(vf a, vf b, std::index_sequence<I...>) {
    return __builtin_shufflevector(a, b, fold_lane(S, I)...) +
           __builtin_shufflevector(a, b, (fold_lane(S, I) + S)...);
}
#else  // GCC before 12 (Ubuntu 22.04's 11, say) has only __builtin_shuffle, with a mask vector
template <int S, size_t... I>
static inline vf fold(vf a, vf b, std::index_sequence<I...>) {
    return __builtin_shuffle(a, b, vi{fold_lane(S, I)...}) +
           __builtin_shuffle(a, b, vi{(fold_lane(S, I) + S)...});
}
#endif
constexpr int bitreverse(int i) {
    int r = 0;
    for (int bit = 1, top = VW / 2; bit < VW; bit <<= 1, top >>= 1)
        if (i & bit) r |= top;
    return r;
}
template <int S>
static inline void fold_level(vf* v, int n) {  // v[0..n) → v[0..n/2)
    for (int i = 0; i < n / 2; i++)
        v[i] = fold<S>(v[2 * i], v[2 * i + 1], std::make_index_sequence<VW>{});
    if constexpr (S > 1) fold_level<S / 2>(v, n / 2);
}
template <size_t... I>
static inline vf sum_lanes_of_each(const vf* acc, std::index_sequence<I...>) {
    vf v[VW] = {acc[bitreverse(I)]...};
    fold_level<VW / 2>(v, VW);
    return v[0];
}
static inline vf sum_lanes_of_each(const vf* acc) {
    return sum_lanes_of_each(acc, std::make_index_sequence<VW>{});
}

// Keeps v in a register: the compiler would rather fold a load into every FMA that uses it,
// which costs a load per FMA where the tiles are built for fewer.
static inline void in_register(vf& v) {
#if defined(__x86_64__) || defined(__i386__)
    asm("" : "+v"(v));
#elif defined(__aarch64__)
    asm("" : "+w"(v));
#endif
}

// ---- exp and log, vectorized, for the softmax and the loss -----------------------------------

static inline vf vexp(vf x) {  // x ≤ 0 here; relative error ~1e-7 (Cephes' expf polynomial)
    x = x < -87.0f ? splat(-87.0f) : x;
    const float magic = 12582912.0f;  // 1.5·2²³: adding it rounds to an integer in the low bits
    vf t = x * 1.44269504f + magic;
    vf n = t - magic;
    vf r = x - n * 0.693359375f - n * -2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    vi scale = ((vi)t - 0x4B400000 + 127) << 23;  // 2ⁿ
    return p * (vf)scale;
}

static inline vf vlog(vf s) {  // s ≥ 1 here (a softmax denominator); relative error ~1e-7
    vi bits = (vi)s;
    vi e = (bits >> 23) - 127;
    vf m = (vf)((bits & 0x7FFFFF) | 0x3F800000);  // s = 2^e · m, m in [1, 2)
    vi big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e = big ? e + 1 : e;
    vf u = (m - 1.0f) / (m + 1.0f);  // log m = 2·atanh(u), |u| ≤ 0.172
    vf u2 = u * u;
    vf series = ((((u2 * (1.0f / 9) + 1.0f / 7) * u2 + 1.0f / 5) * u2 + 1.0f / 3) * u2 + 1.0f);
    return __builtin_convertvector(e, vf) * 0.693147181f + 2.0f * u * series;
}

// ---- the barrier -------------------------------------------------------------------------------

struct alignas(128) Flag {
    std::atomic<long> generation{0};
};

static void barrier(Flag* flags, int t, int n_threads, long generation) {
    flags[t].generation.store(generation, std::memory_order_release);
    for (int u = 0; u < n_threads; u++) {
        int spins = 0;
        while (flags[u].generation.load(std::memory_order_acquire) < generation) {
            pause();
            if (++spins == SPINS_BEFORE_YIELD) {
                sched_yield();
                spins = 0;
            }
        }
    }
}

// ---- one thread's share ------------------------------------------------------------------------

struct Shared {
    const uint8_t* x;       // [n_total, k_in] pixels
    const int64_t* y;       // [n_total] labels
    const int64_t* order;   // [n] this epoch's visiting order
    int64_t n;
    int k_in, batch, bpv, n_threads;
    float lr;
    float* w;               // [10, k_in], updated at the end
    float* b;               // [10]
    float* zp;              // [2 parities][n_threads][10][bpv] partial logits
    Flag* flags;
};

static inline int round_up(int a, int m) { return (a + m - 1) / m * m; }

// Floats a class's row of logits (or of their gradient) takes: whole forward tiles of samples
// for the forward, whole vectors for the softmax.
static inline int logits_stride(int batch) { return round_up(round_up(batch, TS), VW); }

struct Worker {
    const Shared& sh;
    int t, k0, ks, nch;     // my features k0..k0+ks: nch chunks of VW
    float* w;               // [10][ks] my weight slice
    float* xf;              // [batch rounded to TS][ks] widened rows of this step
    float* g;               // [10][bpv] dLoss/dlogits of this step (with 1/nb)
    int32_t* lab;           // [bpv] labels of this step, -1 past nb
    float b[CLASSES];       // every thread keeps the bias, updated identically

    // Logits of classes j0, j0+1 for samples n0..n0+TS−1 over my features, into zp. WIDEN: the
    // rows are read as pixels from `src` and widened on the way (and kept in xf for the rest).
    template <bool WIDEN>
    void forward_tile(int n0, int j0, const uint8_t* const* src, float* zp) const {
        vf acc[TREES * VW] = {};  // acc[c·TS + s]: sample n0+s, class j0+c (zeros past TILE)
        const float* w0 = w + j0 * ks;
        const float* w1 = w0 + ks;
        float* rows = xf + n0 * ks;
        for (int k = 0; k < ks; k += VW) {  // TS + 2 loads, 2·TS FMAs
            vf a = load(w0 + k), c = load(w1 + k);
            for (int s = 0; s < TS; s++) {
                vf xv;
                if constexpr (WIDEN) {
                    xv = widen(src[s] + k);
                    store(rows + s * ks + k, xv);
                } else {
                    xv = load(rows + s * ks + k);
                }
                in_register(xv);
                acc[s] += xv * a;
                acc[TS + s] += xv * c;
            }
        }
        vf r[TREES];
        for (int i = 0; i < TREES; i++) r[i] = sum_lanes_of_each(acc + i * VW);
        for (int s = 0; s < TS; s++) {
            zp[j0 * sh.bpv + n0 + s] = r[s / VW][s % VW];
            zp[(j0 + 1) * sh.bpv + n0 + s] = r[(TS + s) / VW][(TS + s) % VW];
        }
    }

    // Partial logits zp[j][n] = Σ_k x[n][k]·w[j][k] over my features for the step's rows, TS rows
    // at a time: widened by the first class pair, then in L1 for the other four. A last tile
    // past nb repeats the last row (finite; its logits are never read).
    void forward(const int64_t* rows, int nb, float* zp) const {
        for (int n0 = 0; n0 < nb; n0 += TS) {
            const uint8_t* src[TS];
            for (int s = 0; s < TS; s++)
                src[s] = sh.x + rows[std::min(n0 + s, nb - 1)] * sh.k_in + k0;
            forward_tile<true>(n0, 0, src, zp);
            for (int j0 = 2; j0 < CLASSES; j0 += 2) forward_tile<false>(n0, j0, src, zp);
        }
    }

    // Softmax of the summed logits, samples along the lanes; g = (p − onehot)/nb, 0 past nb.
    // Returns the summed loss of the step's samples.
    double softmax(int nb, const float* zp_step) const {
        const float inv255 = 1.0f / 255.0f, inv_nb = 1.0f / nb;
        vi iota;
        for (int i = 0; i < VW; i++) iota[i] = i;
        vf loss = {};
        for (int n = 0; n < nb; n += VW) {
            vf z[CLASSES];
            for (int j = 0; j < CLASSES; j++) {
                vf sum = {};
                for (int u = 0; u < sh.n_threads; u++)
                    sum += load(zp_step + (u * CLASSES + j) * sh.bpv + n);
                z[j] = sum * inv255 + b[j];
            }
            vf m = z[0];
            for (int j = 1; j < CLASSES; j++) m = z[j] > m ? z[j] : m;
            vi label;
            memcpy(&label, lab + n, sizeof label);
            vf total = {}, z_label = {};
            for (int j = 0; j < CLASSES; j++) {
                z_label = label == j ? z[j] : z_label;
                z[j] = vexp(z[j] - m);
                total += z[j];
            }
            vf inv_total = 1.0f / total;
            vi valid = (iota + n) < nb;
            for (int j = 0; j < CLASSES; j++) {
                vf onehot = label == j ? splat(1.0f) : splat(0.0f);
                vf prob = z[j] * inv_total;
                prob = prob < TINY ? vf{} : prob;  // no denormal ever reaches the update's FMAs
                store(g + j * sh.bpv + n, valid ? (prob - onehot) * inv_nb : vf{});
            }
            loss += valid ? vlog(total) + m - z_label : vf{};
        }
        double sum = 0;
        for (int i = 0; i < VW; i++) sum += loss[i];
        return sum;
    }

    // w[j][k] += coef · Σ_n g[j][n]·xf[n][k] for classes j0..j0+4 and chunks c0..c0+TK−1.
    template <int TK>
    void update_tile(int nb, int j0, int c0, float coef) {
        vf acc[TCU][TK] = {};
        for (int n = 0; n < nb; n++) {  // TK + TCU loads, TK·TCU FMAs
            vf xv[TK];
            for (int q = 0; q < TK; q++) xv[q] = load(xf + n * ks + (c0 + q) * VW);
            for (int j = 0; j < TCU; j++) {
                vf gj = splat(g[(j0 + j) * sh.bpv + n]);
                in_register(gj);
                for (int q = 0; q < TK; q++) acc[j][q] += gj * xv[q];
            }
        }
        for (int j = 0; j < TCU; j++)
            for (int q = 0; q < TK; q++) {
                float* p = w + (j0 + j) * ks + (c0 + q) * VW;
                store(p, load(p) + coef * acc[j][q]);
            }
    }

    // The update of my slice; meanwhile the next step's rows (my slice of them) are prefetched.
    void update(int nb, const int64_t* next_rows, int next_nb) {
        const float coef = -sh.lr / 255.0f;
        int tiles = 0;
        for (int c0 = 0; c0 < nch; c0 += TKU) tiles++;
        tiles *= CLASSES / TCU;
        int tile = 0, fetched = 0;
        for (int j0 = 0; j0 < CLASSES; j0 += TCU) {
            for (int c0 = 0; c0 < nch; c0 += TKU, tile++) {
                int upto = next_nb * (tile + 1) / tiles;  // an even share of the rows per tile
                for (; fetched < upto; fetched++) {
                    const uint8_t* row = sh.x + next_rows[fetched] * sh.k_in + k0;
                    for (int k = 0; k < ks; k += 64) __builtin_prefetch(row + k, 0, 2);
                    __builtin_prefetch(row + ks - 1, 0, 2);
                }
                if (c0 + TKU <= nch)
                    update_tile<TKU>(nb, j0, c0, coef);
                else
                    for (int c = c0; c < nch; c++) update_tile<1>(nb, j0, c, coef);
            }
        }
        for (int j = 0; j < CLASSES; j++) {
            float sum = 0;
            for (int n = 0; n < nb; n++) sum += g[j * sh.bpv + n];
            b[j] += -sh.lr * sum;
        }
    }

    void labels(const int64_t* rows, int nb) {
        for (int n = 0; n < sh.bpv; n++) lab[n] = n < nb ? (int32_t)sh.y[rows[n]] : -1;
    }

    // The epoch; returns the summed loss (thread 0's count). `phase(i)` is called after phase i
    // of every step (0 labels, 1 forward, 2 barrier, 3 softmax, 4 update): nothing in the
    // library, a clock in benchmarks/cpu_epoch_phases.cpp.
    // `generation`: the barrier generation the threads last met at.
    template <class Phase>
    double run(Phase&& phase, long generation) {
        double loss = 0;
        for (int64_t start = 0, step = 0; start < sh.n; start += sh.batch, step++) {
            int nb = (int)std::min<int64_t>(sh.batch, sh.n - start);
            int64_t next = start + nb;
            int next_nb = (int)std::min<int64_t>(sh.batch, sh.n - next);
            float* zp = sh.zp + (step & 1) * sh.n_threads * CLASSES * sh.bpv;
            labels(sh.order + start, nb);
            phase(0);
            forward(sh.order + start, nb, zp + t * CLASSES * sh.bpv);
            phase(1);
            barrier(sh.flags, t, sh.n_threads, ++generation);
            phase(2);
            double step_loss = softmax(nb, zp);
            if (t == 0) loss += step_loss;
            phase(3);
            update(nb, sh.order + next, next_nb);
            phase(4);
        }
        for (int j = 0; j < CLASSES; j++)
            memcpy(sh.w + j * sh.k_in + k0, w + j * ks, ks * sizeof(float));
        if (t == 0) memcpy(sh.b, b, sizeof b);
        return loss;
    }
};

template <typename T>
static T* alloc(size_t count) {  // zeroed, 64-byte aligned
    size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    void* p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return static_cast<T*>(p);
}

// Thread t's epoch. Its buffers are allocated by the thread itself (its own malloc arena and
// pages: ~0.5 ms an epoch faster in A/B runs here than allocating them all up front) and its weight
// slice taken; then the threads agree, at a first barrier, that every one has its buffers, so a
// failed allocation stops them all before any training, never leaving a thread short at a later
// barrier. Thread 0's summed loss goes to *loss.
template <class Phase>
static void thread_epoch(const Shared& sh, int t, std::atomic<int>& failures, Phase&& phase,
                         double* loss) {
    const int nch_all = sh.k_in / VW, bt = round_up(sh.batch, TS);
    const int c0 = nch_all * t / sh.n_threads, c1 = nch_all * (t + 1) / sh.n_threads;
    const int ks = (c1 - c0) * VW;
    Worker me{sh, t, c0 * VW, ks, c1 - c0, alloc<float>((size_t)CLASSES * ks),
              alloc<float>((size_t)bt * ks), alloc<float>((size_t)CLASSES * sh.bpv),
              alloc<int32_t>((size_t)sh.bpv), {}};
    if (me.w && me.xf && me.g && me.lab) {
        for (int j = 0; j < CLASSES; j++)
            memcpy(me.w + j * ks, sh.w + j * sh.k_in + me.k0, ks * sizeof(float));
        memcpy(me.b, sh.b, sizeof me.b);
    } else {
        failures.fetch_add(1);
    }
    barrier(sh.flags, t, sh.n_threads, 1);
    if (failures.load() == 0) {
        double sum = me.run(phase, 1);
        if (t == 0) *loss = sum;
    }
    free(me.w);
    free(me.xf);
    free(me.g);
    free(me.lab);
}

// One epoch on sh.n_threads threads, the calling one as thread 0 (sh.bpv, sh.zp and sh.flags are
// filled in here); hook_of(t) is thread t's phase hook (see Worker::run). Returns 0 and the summed
// loss in *loss_sum, or 2 when memory could not be allocated (nothing trained).
template <class HookOf>
static int train_epoch(Shared sh, double* loss_sum, HookOf&& hook_of) {
    sh.bpv = logits_stride(sh.batch);
    sh.zp = alloc<float>((size_t)2 * sh.n_threads * CLASSES * sh.bpv);
    sh.flags = new (std::nothrow) Flag[sh.n_threads];
    std::atomic<int> failures{sh.zp && sh.flags ? 0 : 1};
    if (failures.load() == 0) {
        std::vector<std::thread> others;
        for (int t = 1; t < sh.n_threads; t++)
            others.emplace_back([&, t] { thread_epoch(sh, t, failures, hook_of(t), loss_sum); });
        thread_epoch(sh, 0, failures, hook_of(0), loss_sum);
        for (auto& th : others) th.join();
    }
    free(sh.zp);
    delete[] sh.flags;
    return failures.load() == 0 ? 0 : 2;
}

extern "C" {

int cpu_epoch_vector_width() { return VW; }

// The threads an epoch uses at most: each gets 4 chunks of VW features at least (12 threads for
// 784 features with AVX-512, 24 with AVX2), since every thread also pays for the whole softmax
// and for polling every other thread at the barrier. A guess: measured on 2 cores only.
int cpu_epoch_max_threads(int k_in) { return std::max(1, k_in / (4 * VW)); }

// One epoch in `order`; w [10, k_in] and b [10] updated in place; *loss_sum receives the summed
// training loss. Returns 0, or 1 for bad arguments, 2 when memory cannot be allocated.
int cpu_epoch_train(const uint8_t* x, const int64_t* y, const int64_t* order, int64_t n, int k_in,
                    int batch, float lr, float* w, float* b, int n_threads, double* loss_sum) {
    if (n <= 0 || batch <= 0 || k_in <= 0 || k_in % VW != 0 || n_threads <= 0) return 1;
    n_threads = std::min(n_threads, cpu_epoch_max_threads(k_in));
    Shared sh{x, y, order, n, k_in, batch, 0, n_threads, lr, w, b, nullptr, nullptr};
    return train_epoch(sh, loss_sum, [](int) { return [](int) {}; });
}

}  // extern "C"
