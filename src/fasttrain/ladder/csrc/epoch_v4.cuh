// cuda-epoch v4: v3's step with its two cluster barriers replaced by point-to-point signals on
// mbarriers (see cuda_epoch.cu for the changelog). Thread-block clusters only (sm_90+): there is
// no cooperative-grid v4 (cuda_epoch_variant refuses it).
//
// Protocol, step s, buffer p = s & 1 (every CTA holds two partial-logit inboxes PART[2], two g
// inboxes GB[2], and one mbarrier per inbox, PB[2] and GBAR[2], each initialised with ONE
// expected arrival: its own CTA's "arm", mbarrier.arrive.expect_tx with the bytes the step will
// bring, known in advance from the batch size):
//   L  every CTA stores its partials of row b into PART[p] of b's owner with st.async, each store
//      completing its bytes (complete_tx) on the owner's PB[p]: 40 bytes a row and source.
//   S  the owner waits on its own PB[p] (parity (s >> 1) & 1: PB[p] serves steps p, p+2, ...);
//      it completes when the arm has arrived and all NC * (its valid rows) * 40 bytes have landed.
//      It then stores its rows of g and its bias partial into GB[p] of EVERY CTA with st.async
//      completing on that CTA's GBAR[p]: (nb + NC) * 64 bytes per CTA and step.
//   G  every CTA waits on its own GBAR[p], then updates its W slice as v3 does.
// Nobody waits for anything but data addressed to itself: no cluster-wide barrier in the loop.
//
// Why two buffers, and why they suffice (the invariant): a store for step s+2 into buffer p of
// CTA d happens only after d has finished reading buffer p for step s and has re-armed its
// mbarrier for step s+2.
//   - PART[p] of owner q is written for step s+2 by source d after d's GBAR wait of step s+1,
//     which needs q's bias partial of step s+1 (every owner sends it every step, even with no
//     valid rows), which q sends after S(s+1), hence after S(s) read PART[p] and after q re-armed
//     PB[p] (right after S(s)).
//   - GB[p] of d is written for step s+2 by owner q after q's PB wait of step s+2 or (when q owns
//     no valid row of step s+2) at least after q's GBAR wait of step s+1, which needs d's bias
//     partial of step s+1, which d sends after its G(s) finished reading GB[p] and re-armed GBAR[p].
//   - Step s+1 uses the other buffer and the other mbarrier, so its early stores (a CTA may be
//     one step ahead of a slow owner) never mix with step s's data or bytes.
// The re-arm of an mbarrier happens after a __syncthreads that follows every thread's wait on it,
// so no thread can miss a phase (an arm of 0 bytes completes the phase at once).
// A CTA exits only after its last GBAR wait, when every byte any CTA will ever send it has landed.
//
// Bounded waits: every wait spins on mbarrier.try_wait.parity.acquire.cluster at most
// WAIT_BUDGET clocks (~60 ms), polling the global error flag every 64 failed tries; on timeout it
// records (kind, rank, step) in the flag. The CTA decides to abort with __syncthreads_or (a barrier
// v3 already has), skips writing back its weights and exits; the other CTAs see the flag within
// their own wait and exit too. The flag is sticky: a launch that finds it set exits at once
// (uniformly, before the first cluster barrier), until the host reads and clears it
// (cuda_epoch_signal_status), which turns it into a distinct error code.
#pragma once
#include "epoch_v3.cuh"

namespace {

constexpr int THREADS4 = THREADS3;
constexpr long long WAIT_BUDGET = 1LL << 27;  // clocks: ~70 ms at 1.98 GHz, ~130 ms at 1 GHz
constexpr int SIGNAL_TIMEOUT = 20001;  // cuda_epoch_signal_status's code (not a cudaError_t)
enum SignalWait { WAIT_PARTIALS = 1, WAIT_G = 2 };

// 0, or kind | rank << 4 | step << 12 of the first wait that timed out (sticky, see above).
__device__ int g_signal_error;
// Test hook (cuda_epoch_signal_fault): 1 = CTA 0 arms its partials' mbarrier for step 2 with 16
// bytes more than will come, so that wait must time out (the GPU test of the no-hang path).
__device__ int g_signal_fault;

template <int NC>
struct Shape4 {
  using S3 = Shape3<NC>;
  static constexpr int F = S3::F, FP = S3::FP, KG = S3::KG, RPC = S3::RPC, UNITS = S3::UNITS,
                       RG = S3::RG;
  static constexpr int PART = S3::PART;             // one partial-logit inbox [NC][RPC][16]
  static constexpr int GB = S3::GIN + S3::DBIN;     // one g inbox [BMAX][16] + [NC][16]
  static constexpr int INBOX = 2 * PART + 2 * GB;   // PART[2], then GB[2]
  // Shared memory, in floats (every region 16-byte aligned).
  static constexpr int W_OFF = 0;
  static constexpr int BIAS_OFF = W_OFF + C * F;
  static constexpr int XF_OFF = BIAS_OFF + 16;
  static constexpr int INBOX_OFF = XF_OFF + 2 * BMAX * FP;
  static constexpr int BAR_OFF = INBOX_OFF + INBOX;  // PB[2], GBAR[2]: 4 x 8 bytes
  static constexpr int RED_OFF = BAR_OFF + 8;
  static constexpr int GL_OFF = RED_OFF + RG * C * F;
  static constexpr int IDX_OFF = GL_OFF + RPC * 16;
  static constexpr int YS_OFF = IDX_OFF + 4 * BMAX;
  static constexpr int XB_OFF = YS_OFF + 4 * BMAX;
  static constexpr int BYTES = XB_OFF * 4 + 2 * BMAX * F;
  static_assert(BYTES <= 227 * 1024, "fits a Hopper SM's shared memory");
  static_assert((NC * RPC * 40) < (1 << 20) && (BMAX + NC) * 64 < (1 << 20), "tx-count range");
};

// ---- sm_90 PTX: mbarriers, DSMEM addresses, st.async (empty below sm_90, never called there) --
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t mapa(uint32_t addr, int rank) {  // my address -> rank's
  uint32_t out = addr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
#endif
  return out;
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence() {  // the inits, visible to the cluster
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// The one expected arrival of a phase, announcing the bytes the phase's st.asyncs will bring.
__device__ __forceinline__ void mbar_arm(uint32_t bar, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, int parity) {
  uint32_t done = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred p;\n"
      " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
#endif
  return done != 0;
}
// Stores into another CTA's shared memory (cluster addresses from mapa), completing their bytes
// on that CTA's mbarrier `bar` (also a cluster address).
__device__ __forceinline__ void st_async4(uint32_t dst, uint4 v, uint32_t bar) {  // 16 bytes
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
      ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ void st_async4(uint32_t dst, float4 v, uint32_t bar) {
  st_async4(dst, make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z),
                            __float_as_uint(v.w)),
            bar);
}
__device__ __forceinline__ void st_async1(uint32_t dst, float v, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(
                   dst),
               "f"(v), "r"(bar)
               : "memory");
#endif
}

// Wait for phase `parity` of my mbarrier `bar`, at most WAIT_BUDGET clocks. False on a timeout
// (recorded in g_signal_error) or when another CTA has recorded one.
__device__ __noinline__ bool bounded_wait_slow(uint32_t bar, int parity, int code) {
  const long long t0 = clock64();
  for (int n = 1;; ++n) {
    if (mbar_try_wait(bar, parity)) return true;
    if ((n & 63) == 0 && *static_cast<volatile int*>(&g_signal_error) != 0) return false;
    if (clock64() - t0 > WAIT_BUDGET) {
      atomicCAS(&g_signal_error, 0, code);
      return false;
    }
  }
}
__device__ __forceinline__ bool bounded_wait(uint32_t bar, int parity, int code) {
  return mbar_try_wait(bar, parity) || bounded_wait_slow(bar, parity, code);
}

// Where a v4 step's time goes (cuda_epoch_phase_profile): each CTA's thread 0 sums the clocks
// of each phase of the loop, and CTA 0 the loop's wall time in ns (globaltimer) to convert them.
// Compiled into a separate kernel (TIMED), so the timed row's kernel has no extra registers.
enum Phase {
  PH_PARTIALS,   // issue the prefetches, partial logits, their st.async sends
  PH_WIDEN,      // wait for the next batch's bytes, widen them to floats
  PH_WAIT_PART,  // wait for my rows' partials from every CTA
  PH_SOFTMAX,    // softmax of my rows, re-arm, send g to every CTA
  PH_WAIT_G,     // wait for every row's g
  PH_UPDATE,     // weight-gradient partials, reduction, update
  PHASES
};
__device__ unsigned long long g_phase_clocks[16][PHASES];
__device__ long long g_phase_ns[2];  // CTA 0: the loop's globaltimer span; steps

template <bool ON>
struct PhaseClock {  // off: nothing
  __device__ void mark(int) {}
  __device__ void write(int, int) {}
};
template <>
struct PhaseClock<true> {
  long long last, t0_ns;
  unsigned long long sum[PHASES];
  __device__ PhaseClock() {
    for (int k = 0; k < PHASES; ++k) sum[k] = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0_ns));
    last = clock64();
  }
  __device__ void mark(int phase) {
    const long long now = clock64();
    sum[phase] += now - last;
    last = now;
  }
  __device__ void write(int r, int steps) {
    if (threadIdx.x != 0) return;
    for (int k = 0; k < PHASES; ++k) g_phase_clocks[r][k] = sum[k];
    if (r == 0) {
      long long t1;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
      g_phase_ns[0] = t1 - t0_ns;
      g_phase_ns[1] = steps;
    }
  }
};

// Send my rows of g (gl [RPC][16]) and their sum to every CTA's GB[p] (gb_u: my g inboxes, S::GB
// floats each; gbar_u: my GBAR[2]), completing on its GBAR[p]. v4's and v6's.
template <int NC, class S>
__device__ __forceinline__ void send_g_rows(const float* gl, uint32_t gb_u, uint32_t gbar_u, int r,
                                            int tid, int T, int p, int nb) {
  constexpr int RPC = S::RPC;
  for (int it = tid; it < NC * (RPC + 1) * 4; it += T) {
    const int v = it & 3, i = (it >> 2) % (RPC + 1), q = (it >> 2) / (RPC + 1);
    float4 val;
    int off;
    if (i < RPC) {
      const int row = r * RPC + i;
      if (row >= nb) continue;
      val = *reinterpret_cast<const float4*>(gl + i * 16 + 4 * v);
      off = row * 16 + 4 * v;
    } else {
      val = g_rows_sum<S>(gl, v);
      off = Shape3<NC>::GIN + r * 16 + 4 * v;
    }
    st_async4(mapa(gb_u + 4 * (p * S::GB + off), q), val, mapa(gbar_u + 8 * p, q));
  }
}

// v4's step: v3's fp32 arithmetic on the CUDA cores, its data moved by the signals. A step
// policy of train_epoch_signalled (below), which v5 (epoch_v5.cuh) shares with another.
template <int NC>
struct StepV4 {
  using S = Shape4<NC>;
  static constexpr int T = THREADS4, F = S::F, FP = S::FP, RPC = S::RPC;
  static constexpr int G_ROW_BYTES = 64;  // a row of g in a g inbox (GBAR's bytes: + 64 a CTA)
  const int r, tid, k0;
  float* const sm;
  float* const Ws = sm + S::W_OFF;
  float* const bias = sm + S::BIAS_OFF;
  float* const xf = sm + S::XF_OFF;
  float* const red = sm + S::RED_OFF;
  float* const gl = sm + S::GL_OFF;
  int* const idx = reinterpret_cast<int*>(sm + S::IDX_OFF);
  int* const ys = reinterpret_cast<int*>(sm + S::YS_OFF);
  uint8_t* const xb = reinterpret_cast<uint8_t*>(sm + S::XB_OFF);
  const float* const part0 = sm + S::INBOX_OFF;  // [2][PART]
  const float* const gb0 = part0 + 2 * S::PART;  // [2][GB]
  const uint32_t part_u = smem_addr(part0), gb_u = smem_addr(gb0);
  const uint32_t pbar_u = smem_addr(sm + S::BAR_OFF), gbar_u = pbar_u + 16;  // PB[2], GBAR[2]

  __device__ StepV4(float* sm_, int r_) : r(r_), tid(threadIdx.x), k0(r_ * F), sm(sm_) {}
  __device__ const float* x(int p) const { return xf + p * BMAX * FP; }
  __device__ const float* part(int p) const { return part0 + p * S::PART; }

  __device__ void setup(const Args& a) {  // before the first CTA barrier
    load_slice<F, T>(a, k0, tid, Ws, bias);
    for (int i = tid; i < 2 * BMAX * FP; i += T) xf[i] = 0.f;
    for (int i = tid; i < S::INBOX; i += T) sm[S::INBOX_OFF + i] = 0.f;  // pad slots: finite
  }
  __device__ void prepare() {}  // after it
  __device__ void widen(int j, int rows) { widen_batch<S>(j, rows, tid, xb, xf); }

  // L (as v3), each pair's float4 + float going to the owner with st.async on its PB[p].
  __device__ void send_partials(int p, int nb) {
    const int row = tid >> 2, h = (tid >> 1) & 1, fh = tid & 1;
    float acc[5];
    partial_logits<S>(x(p), Ws, tid, acc);
    if (row < nb) {
      const int q = row / RPC;
      const uint32_t dst =
          mapa(part_u + 4 * (p * S::PART + (r * RPC + row % RPC) * 16 + 8 * h), q);
      const uint32_t bar = mapa(pbar_u + 8 * p, q);
      if (fh == 0)
        st_async4(dst, make_float4(acc[0], acc[1], acc[2], acc[3]), bar);
      else
        st_async1(dst + 16, acc[4], bar);
    }
  }

  __device__ void send_g(int p, int nb) { send_g_rows<NC, S>(gl, gb_u, gbar_u, r, tid, T, p, nb); }

  // G: the weight-gradient partials (before the CTA barrier), then the update (after it).
  __device__ void gradient(int p, int nb) {
    gradient_partials<S>(PlainRead{}, x(p), gb0 + p * S::GB, red, tid, nb);
  }
  __device__ void update(int p) {
    apply_update<NC, S>(PlainRead{}, red, gb0 + p * S::GB + Shape3<NC>::GIN, Ws, bias, tid, T);
  }
  __device__ void write_back(const Args& a, float loss, float correct) {
    ::write_back<F, T>(a, r, k0, tid, Ws, bias, loss, correct);
  }
};

// The loop of v4, v5 and v6: the signals' protocol (see the top) around a step policy St (StepV4;
// StepV5: the same data movement with the arithmetic on tensor cores; StepV6: register-tiled).
template <int NC, class St, bool TIMED = false>
__device__ void train_epoch_signalled(int r, const Args& a, float* sm) {
  constexpr int RPC = St::RPC, T = St::T;
  St st(sm, r);
  const int tid = threadIdx.x;
  // Stale failure of an earlier launch not yet read by the host: every CTA reads the same value
  // (nothing writes it before the first barrier below), so all of them leave here together.
  if (*static_cast<volatile int*>(&g_signal_error) != 0) return;
  int* idx = st.idx;
  const uint32_t pbar_u = st.pbar_u, gbar_u = st.gbar_u;
  const int steps = (a.n + a.bs - 1) / a.bs;
  auto rows_of = [&](int step) { return min(a.bs, a.n - step * a.bs); };
  auto part_bytes = [&](int step) {  // what PB brings for `step`: NC sources x my rows x 40
    return NC * 40 * max(0, min(RPC, rows_of(step) - r * RPC));
  };
  auto g_bytes = [&](int step) {  // GBAR: the rows of g, and every owner's bias partial
    return St::G_ROW_BYTES * rows_of(step) + 64 * NC;
  };

  st.setup(a);
  if (tid == 0) {
    for (int p = 0; p < 2; ++p) {
      mbar_init(pbar_u + 8 * p, 1);
      mbar_init(gbar_u + 8 * p, 1);
    }
    mbar_init_fence();
    for (int p = 0; p < 2 && p < steps; ++p) {  // arm steps 0 and 1
      mbar_arm(pbar_u + 8 * p, part_bytes(p));
      mbar_arm(gbar_u + 8 * p, g_bytes(p));
    }
  }
  for (int j = 0; j < 4 && j < steps; ++j)
    for (int i = tid; i < rows_of(j); i += T) idx[j * BMAX + i] = a.order[j * a.bs + i];
  __syncthreads();
  st.prepare();
  auto fetch = [&](int j) { fetch_batch<St>(a, j, rows_of(j), tid, st.k0, idx, st.ys, st.xb); };
  fetch(0);
  if (steps > 1) fetch(1);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  st.widen(0, rows_of(0));
  // Every CTA's mbarriers are initialised and armed before anyone signals them. The only
  // unbounded wait: every CTA reaches it unconditionally, right after its set-up.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
#endif

  float loss = 0.f, correct = 0.f;
  bool failed = false;
  PhaseClock<TIMED> clock;
  for (int s = 0; s < steps; ++s) {
    const int nb = rows_of(s), p = s & 1, parity = (s >> 1) & 1;
    prefetch_ahead<St>(a, s, steps, tid, st.k0, idx, st.ys, st.xb);  // as v3

    st.send_partials(p, nb);  // L
    clock.mark(PH_PARTIALS);
    // Window while the partials travel: the next batch's bytes -> floats.
    __pipeline_wait_prior(1);
    __syncthreads();
    if (s + 1 < steps) st.widen(s + 1, rows_of(s + 1));
    clock.mark(PH_WIDEN);

    // S: wait for my rows' NC partials (mine only), then as v3.
    bool ok = bounded_wait(pbar_u + 8 * p, parity, WAIT_PARTIALS | r << 4 | s << 12);
    clock.mark(PH_WAIT_PART);
    softmax_rows<NC, St>(PlainRead{}, st.part(p), st.bias, st.ys + (s & 3) * BMAX, st.gl, tid, r,
                         nb, a.lr, loss, correct);
    if (__syncthreads_or(!ok)) {
      failed = true;
      break;
    }
    if (tid == 0 && s + 2 < steps)  // PART[p] read: re-arm for step s + 2
      // The test hook (step 2 only), read where it is used: no register held over the loop.
      mbar_arm(pbar_u + 8 * p,
               part_bytes(s + 2) + (s == 0 && r == 0 && g_signal_fault == 1 ? 16 : 0));
    st.send_g(p, nb);
    clock.mark(PH_SOFTMAX);

    // G: wait for every row's g and every owner's bias partial (addressed to me), then as v3.
    ok = bounded_wait(gbar_u + 8 * p, parity, WAIT_G | r << 4 | s << 12);
    clock.mark(PH_WAIT_G);
    st.gradient(p, nb);
    if (__syncthreads_or(!ok)) {
      failed = true;
      break;
    }
    if (tid == 0 && s + 2 < steps) mbar_arm(gbar_u + 8 * p, g_bytes(s + 2));  // see the top
    st.update(p);
    __syncthreads();
    clock.mark(PH_UPDATE);
  }
  __pipeline_wait_prior(0);  // no cp.async left in flight into this CTA's memory
  if (failed) return;        // the weights of this launch are not written back (see the top)
  clock.write(r, steps);
  st.write_back(a, loss, correct);
}

}  // namespace
