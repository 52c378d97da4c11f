// The CPU side of tests/ladder/test_cuda_epoch_v6_math.py: cuda-epoch v6's tiles
// (epoch_v6_math.cuh) compiled for the host and run as the kernel runs them, on a whole cluster
// of NC CTAs for whole epochs: every thread of every CTA, the lanes of a shuffle in lockstep
// (each step's sends are all taken before any lane applies what it received, as SHFL does), the
// partial logits delivered into their owners' inboxes at the offsets StepV6 sends them to, the
// owners' softmax (v4's softmax_rows, written out here: the GPU tests check the kernel's own), g
// and the bias partials to every CTA, and G. Also the index bookkeeping: every product, sum,
// register and write counted, and the shared-memory layout.
#define FT_HOST_MATH
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "epoch_v4.cuh"  // Shape4: v6 keeps its inboxes
#include "epoch_v6_math.cuh"

#if !defined(__CUDA_ARCH__)  // host code only: nvcc's device pass sees nothing here
namespace {

int slot_of(int c) { return c + 3 * (c >= 5); }

template <int NC>
struct Cta {  // one CTA's shared memory (the parts v6 uses) and its threads' W registers
  using S = Shape6<NC>;
  std::vector<float> xf, w, part, gb, red, dw, gl;
  float bias[16] = {};
  Cta()
      : xf(BMAX * S::FP, 3.f),  // rows past a partial batch: stale but finite, as in the kernel
        w(S::T * S::WN),
        part(S::PART, 0.f),
        gb(S::GB, 5.f),  // g rows no step has sent yet: finite, and must not count
        red(S::RG * C * S::F, NAN),
        dw(2 * S::LJ * S::WB, NAN),
        gl(S::RPC * 16, 0.f) {}
};

// Step k of the reduce-scatter for a group's LJ lanes together: every send is taken before any
// lane applies what it received, as one SHFL.
template <class S>
void lockstep(float (&acc)[S::LJ][S::NACC], const LTile (&t)[S::LJ], int k) {
  const RsStep s = rs_step<S>(k);
  float sent[S::LJ];
  for (int j = 0; j < S::LJ; ++j) sent[j] = rs_send(acc[j], (t[j].j & s.d) != 0, s);
  for (int j = 0; j < S::LJ; ++j) rs_apply(acc[j], (t[j].j & s.d) != 0, s, sent[j ^ s.d]);
}

// L of CTA r: every row group and class half, its LJ lanes in lockstep through the shuffles, then
// each lane's result into its owner's inbox.
template <int NC>
void logits(std::vector<Cta<NC>>& ctas, int r, int nb) {
  using S = Shape6<NC>;
  Cta<NC>& me = ctas[r];
  for (int g = 0; g < S::T / S::LJ; ++g) {
    float acc[S::LJ][S::NACC];
    LTile t[S::LJ];
    for (int j = 0; j < S::LJ; ++j) t[j] = l_tile<S>(g * S::LJ + j);
    l_schedule<S>(
        [&](int i) {  // every lane's row i
          for (int j = 0; j < S::LJ; ++j)
            logits_row<S>(me.xf.data(), &me.w[(g * S::LJ + j) * S::WN], t[j], i, acc[j]);
        },
        [&](int k) { lockstep<S>(acc, t, k); }, [] {});
    for (int j = 0; j < S::LJ; ++j) {
      if (l_out_row<S>(t[j]) >= nb) continue;
      float* dst = ctas[l_out_owner<S>(t[j])].part.data() + l_out_offset<S>(t[j], r);
      if (l_out_part(t[j]) == 0)
        std::memcpy(dst, acc[j], 16);
      else
        dst[0] = acc[j][4];
    }
  }
}

// S of owner q (v4's softmax_rows and send_g, in fp32): its rows' g into every CTA's g inbox,
// its bias partial likewise.
template <int NC>
void softmax(std::vector<Cta<NC>>& ctas, int q, int nb, const int* labels, float lr,
             double& loss, double& correct) {
  using S = Shape6<NC>;
  Cta<NC>& me = ctas[q];
  const float inv255 = 1.f / 255.f;
  std::fill(me.gl.begin(), me.gl.end(), 0.f);
  for (int i = 0; i < S::RPC; ++i) {
    const int row = q * S::RPC + i;
    if (row >= nb) continue;
    float z[C], m = -INFINITY, se = 0.f;
    for (int c = 0; c < C; ++c) {
      float acc = 0.f;
      for (int src = 0; src < NC; ++src) acc += me.part[(src * S::RPC + i) * 16 + slot_of(c)];
      z[c] = acc * inv255 + me.bias[c];
      m = std::fmax(m, z[c]);
    }
    float e[C];
    for (int c = 0; c < C; ++c) se += e[c] = std::exp(z[c] - m);
    const int label = labels[row];
    loss += std::log(se) + m - z[label];
    correct += z[label] == m ? 1 : 0;
    for (int c = 0; c < C; ++c)
      me.gl[i * 16 + slot_of(c)] = lr * (e[c] / se - (c == label ? 1.f : 0.f)) / nb;
  }
  for (Cta<NC>& d : ctas) {
    for (int i = 0; i < S::RPC; ++i)
      if (q * S::RPC + i < nb)
        std::memcpy(&d.gb[(q * S::RPC + i) * 16], &me.gl[i * 16], 64);
    for (int l = 0; l < 16; ++l) {  // g_rows_sum: my rows in order, 0 past the batch
      float sum = 0.f;
      for (int i = 0; i < S::RPC; ++i) sum += me.gl[i * 16 + l];
      d.gb[Shape3<NC>::GIN + q * 16 + l] = sum;
    }
  }
}

// G of CTA r: the partials, the row groups' sum (RS = 2: each pair's swap in lockstep), the bias,
// and every thread's registers minus its block of DW.
template <int NC>
void gradient(Cta<NC>& me, int nb) {
  using S = Shape6<NC>;
  const float inv255 = 1.f / 255.f;
  for (int tid = 0; tid < S::T; ++tid) gradient_partials6<S>(me.xf.data(), me.gb.data(),
                                                             me.red.data(), tid, nb);
  std::vector<float4> sum(S::T);
  for (int tid = 0; tid < S::T; ++tid) sum[tid] = g_sum<S>(me.red.data(), g_out<S>(tid));
  for (int tid = 0; tid < S::T; ++tid) {
    const GOut o = g_out<S>(tid);
    if (!o.active) continue;
    if (S::RS == 2) {
      for (int m = 0; m < 2; ++m) {
        const float got = g_swap_send(sum[tid ^ 1], o.s ^ 1, m);  // the partner's send
        me.dw[dw_index<S>(o.c, o.kg * 4 + 2 * o.s + m)] =
            g_swap_keep(sum[tid], o.s, m, got) * inv255;
      }
    } else {
      const float v[4] = {sum[tid].x, sum[tid].y, sum[tid].z, sum[tid].w};
      for (int m = 0; m < 4; ++m) me.dw[dw_index<S>(o.c, o.kg * 4 + m)] = v[m] * inv255;
    }
  }
  for (int tid = 0; tid < S::T; ++tid)
    update_bias<NC>(me.gb.data() + Shape3<NC>::GIN, me.bias, tid, S::T);
  for (int tid = 0; tid < S::T; ++tid) apply_dw<S>(me.dw.data(), l_tile<S>(tid),
                                                   &me.w[tid * S::WN]);
}

template <int NC>
int run_epoch(const uint8_t* x, const int* y, const int* order, int n, int bs, float lr,
              float* w, float* b, double* stats) {
  using S = Shape6<NC>;
  std::vector<Cta<NC>> ctas(NC);
  for (int r = 0; r < NC; ++r)  // StepV6::setup
    for (int tid = 0; tid < S::T; ++tid) {
      const LTile t = l_tile<S>(tid);
      for (int c = 0; c < 5; ++c)
        for (int e = 0; e < S::FL; ++e)
          ctas[r].w[tid * S::WN + c * S::FL + e] =
              w[l_class(t, c) * K + r * S::F + l_feature<S>(t, e)];
      if (tid < C) ctas[r].bias[tid] = b[tid];
    }
  std::vector<int> labels(BMAX);
  for (int start = 0; start < n; start += bs) {
    const int nb = std::min(bs, n - start);
    for (int row = 0; row < nb; ++row) labels[row] = y[order[start + row]];
    for (int r = 0; r < NC; ++r)  // the batch's pixels of my features, as floats (widen)
      for (int row = 0; row < nb; ++row)
        for (int k = 0; k < S::F; ++k)
          ctas[r].xf[row * S::FP + k] = x[static_cast<size_t>(order[start + row]) * K +
                                          r * S::F + k];
    for (int r = 0; r < NC; ++r) logits<NC>(ctas, r, nb);
    for (int q = 0; q < NC; ++q) softmax<NC>(ctas, q, nb, labels.data(), lr, stats[0], stats[1]);
    for (int r = 0; r < NC; ++r) gradient<NC>(ctas[r], nb);
  }
  int replicas_differ = 0;
  for (int r = 0; r < NC; ++r)  // StepV6::write_back: the first row group's tiles
    for (int tid = 0; tid < S::T; ++tid) {
      const LTile t = l_tile<S>(tid);
      for (int c = 0; c < 5; ++c)
        for (int e = 0; e < S::FL; ++e) {
          const float v = ctas[r].w[tid * S::WN + c * S::FL + e];
          float& out = w[l_class(t, c) * K + r * S::F + l_feature<S>(t, e)];
          if (t.rg == 0)
            out = v;
          else
            replicas_differ += std::memcmp(&v, &ctas[r].w[(tid % S::LG) * S::WN + c * S::FL + e],
                                           4) != 0;
        }
    }
  std::memcpy(b, ctas[0].bias, 4 * C);
  return replicas_differ;
}

// The bookkeeping of CTA shape S: how many counts are not what they must be.
template <int NC>
int mapping_violations() {
  using S = Shape6<NC>;
  constexpr int F = S::F;
  int bad = 0;
  auto expect = [&](const std::vector<int>& count, int want) {
    for (int v : count) bad += v != want;
  };
  // L: every (row, class, feature) product once over threads x (i, c, e).
  std::vector<int> prod(BMAX * C * F, 0);
  for (int tid = 0; tid < S::T; ++tid) {
    const LTile t = l_tile<S>(tid);
    for (int i = 0; i < S::RT; ++i)
      for (int c = 0; c < 5; ++c)
        for (int e = 0; e < S::FL; ++e)
          ++prod[(l_row<S>(t, i) * C + l_class(t, c)) * F + l_feature<S>(t, e)];
  }
  expect(prod, 1);
  // L's sums: every (row, class) held by exactly one lane after the reduce-scatter.
  std::vector<int> out(BMAX * C, 0);
  for (int tid = 0; tid < S::T; ++tid) {
    const LTile t = l_tile<S>(tid);
    const int part = l_out_part(t);
    for (int c = part ? 4 : 0; c < (part ? 5 : 4); ++c) ++out[l_out_row<S>(t) * C + l_class(t, c)];
    // ... at the inbox slot the owner's softmax reads for it.
    const int row = l_out_row<S>(t), want = (0 * S::RPC + row % S::RPC) * 16 +
                                             slot_of(l_class(t, part ? 4 : 0));
    bad += l_out_offset<S>(t, 0) != want || l_out_owner<S>(t) != row / S::RPC;
  }
  expect(out, 1);
  // ... and the reduce-scatter routes them there: lane j puts 2^j in one accumulator (i, c);
  // afterwards exactly the lane that holds (row i, class c) has the sum of all LJ of them there,
  // and no lane's output holds anything else.
  for (int a = 0; a < S::NACC; ++a) {
    float acc[S::LJ][S::NACC] = {};
    LTile t[S::LJ];
    for (int j = 0; j < S::LJ; ++j) {
      t[j] = l_tile<S>(j);
      acc[j][a] = static_cast<float>(1 << j);
    }
    for (int k = 0; k < S::NSHFL; ++k) lockstep<S>(acc, t, k);
    const int i = a / 5, c = a % 5;
    for (int j = 0; j < S::LJ; ++j) {
      const bool mine = l_out_row<S>(t[j]) == i && l_out_part(t[j]) == (c == 4);
      for (int v = 0; v < 5; ++v) {
        if (l_out_part(t[j]) != (v == 4)) continue;  // not an output of this lane
        const float want = mine && v == c ? static_cast<float>((1 << S::LJ) - 1) : 0.f;
        bad += acc[j][v] != want;
      }
    }
  }
  // G's partials: every (row, class, feature) product once, for a full batch.
  std::fill(prod.begin(), prod.end(), 0);
  for (int tid = 0; tid < S::T; ++tid) {
    const GUnit u = g_unit<S>(tid);
    if (u.rg >= S::RG) continue;
    for (int row = u.rg; row < BMAX; row += S::RG)
      for (int c = 0; c < 5; ++c)
        for (int m = 0; m < 4; ++m) ++prod[(row * C + 5 * u.h + c) * F + u.kg * 4 + m];
  }
  expect(prod, 1);
  // G's sum: every row group's float4 read once; every DW entry written once, at a distinct slot
  // of the thread blocks; every thread's register e is the entry of its own weight.
  std::vector<int> reads(S::RG * C * S::KG, 0), dws(2 * S::LJ * S::WB, 0);
  for (int tid = 0; tid < S::T; ++tid) {
    const GOut o = g_out<S>(tid);
    if (!o.active) continue;
    for (int q = o.s; q < S::RG; q += S::RS) ++reads[(q * C + o.c) * S::KG + o.kg];
    for (int m = 0; m < 4 / S::RS; ++m)
      ++dws[dw_index<S>(o.c, o.kg * 4 + (4 / S::RS) * o.s + m)];
  }
  expect(reads, 1);
  for (int blk = 0; blk < 2 * S::LJ; ++blk)
    for (int v = 0; v < S::WB; ++v) bad += dws[blk * S::WB + v] != (v < S::WN ? 1 : 0);
  std::vector<int> wb(C * F, 0);
  for (int tid = 0; tid < S::T; ++tid) {
    const LTile t = l_tile<S>(tid);
    for (int c = 0; c < 5; ++c)
      for (int e = 0; e < S::FL; ++e) {
        const int cls = l_class(t, c), k = l_feature<S>(t, e);
        bad += dw_index<S>(cls, k) != (t.h * S::LJ + t.j) * S::WB + c * S::FL + e;
        if (t.rg == 0) ++wb[cls * F + k];  // written back once
      }
  }
  expect(wb, 1);
  return bad;
}

// Shared memory of shape S: the regions in order, none overlapping the next, each 16-byte aligned
// (float4 and st.async.v4 targets; the mbarriers need 8), within a Hopper SM's 227 KiB.
template <int NC>
int layout_violations() {
  using S = Shape6<NC>;
  const int regions[][2] = {  // offset, floats
      {S::BIAS_OFF, 16},          {S::XF_OFF, 2 * BMAX * S::FP}, {S::INBOX_OFF, S::INBOX},
      {S::BAR_OFF, 8},            {S::RED_OFF, S::RG * C * S::F}, {S::DW_OFF, 2 * S::LJ * S::WB},
      {S::GL_OFF, S::RPC * 16},   {S::IDX_OFF, 4 * BMAX},         {S::YS_OFF, 4 * BMAX},
      {S::XB_OFF, 2 * BMAX * S::F / 4}};
  int bad = 0, end = 0;
  for (const auto& reg : regions) {
    bad += reg[0] != end || reg[0] % 4 != 0;
    end = reg[0] + reg[1];
  }
  bad += S::BYTES != 4 * end || S::BYTES > 227 * 1024 || (2 * BMAX * S::F) % 4 != 0;
  bad += S::GB != Shape4<NC>::GB || S::PART != Shape4<NC>::PART;  // v4's inboxes
  return bad;
}

}  // namespace

extern "C" {

// One epoch of a whole cluster (ctas 7 or 14) in `order`: x uint8 [n][784], y int32 [n], order
// int32 [n], w [10][784] and b [10] updated in place, stats [2] += (loss sum, correct). Returns
// the number of W registers whose replicas (row groups) differ from the first's (must be 0), or
// -1 for a bad argument.
int v6_epoch(int ctas, const uint8_t* x, const int* y, const int* order, int n, int bs, float lr,
             float* w, float* b, double* stats) {
  if (bs < 1 || bs > BMAX || n < 1) return -1;
  if (ctas == 7) return run_epoch<7>(x, y, order, n, bs, lr, w, b, stats);
  if (ctas == 14) return run_epoch<14>(x, y, order, n, bs, lr, w, b, stats);
  return -1;
}

int v6_mapping_violations(int ctas) {
  if (ctas == 7) return mapping_violations<7>() + layout_violations<7>();
  if (ctas == 14) return mapping_violations<14>() + layout_violations<14>();
  return -1;
}

// The shape the tests name in their messages: LJ, RT, NSHFL, RS of `ctas`.
void v6_shape(int ctas, int* out) {
  auto put = [&](auto s) {
    using S = decltype(s);
    out[0] = S::LJ;
    out[1] = S::RT;
    out[2] = S::NSHFL;
    out[3] = S::RS;
  };
  if (ctas == 7) put(Shape6<7>{});
  if (ctas == 14) put(Shape6<14>{});
}

}  // extern "C"
#endif
