// The AVX-512 inner loops (16 float lanes): the GEMM micro-kernel on 64-column weight panels
// and one KV head of paged attention. The extension is compiled for AVX2 (-mavx2 -mfma), so
// every function here carries AVX512 (a target attribute) and runs only where kernels.cpp
// found AVX-512 on the CPU. No lambdas here: they would not inherit the attribute.
// Attention differs from the AVX2 file in its schedule, not its per-key arithmetic beyond the
// lane count: scores 16 keys at a time with one shared reduction tree, all query heads of a
// KV head summing values in one pass, and prefetches for the next scattered KV blocks.

#include <immintrin.h>

#include <algorithm>
#include <limits>

#include "kernels.h"

#define AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma")))

namespace servelab {
namespace {

// Output columns per packed weight panel: four zmm vectors. A 6 x 64 tile holds 24
// accumulators + 4 weights + 1 input in the 32 registers and issues 24 FMAs per 10 loads, and
// a single row still streams its weights through 4 independent FMA chains. The row tiling
// stays MR = 6 like AVX2's, so the cost model's row knots hold on both ISAs (a 12 x 32 tile
// would be ~10% faster at 7-12 rows and no faster elsewhere).
constexpr int64_t NR = 64;
constexpr int V = NR / 16;
// The weights 16 k-steps (4 KiB) ahead are requested while these are used: the hardware
// prefetcher stops at each 4 KiB page, which cost the weight stream 30-50% at decode row
// counts on a weight matrix too large for L2 (the vocab projection); compute-bound shapes
// are unaffected. Past the end of a panel slice it fetches the next panel, read next anyway.
constexpr int64_t PREFETCH_K = 16;

template <int R>
AVX512 void micro_kernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
                         bool accumulate) {
  __m512 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    __m512 w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      w[v] = _mm512_loadu_ps(b + kk * NR + 16 * v);
      _mm_prefetch(reinterpret_cast<const char*>(b + (kk + PREFETCH_K) * NR + 16 * v),
                   _MM_HINT_T0);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[kk * MR + r]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(x, w[v], acc[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
  }
}

// A [KC, NR] weight slice is 128 KiB, read from L2 by each row tile (at 256 it would still
// not share L1 with the input); fewer K blocks mean fewer passes over the output, and layers
// with K <= 512 need none.
constexpr int64_t KC = 512;
constexpr GemmTile TILE = {NR, KC,
                           {nullptr, micro_kernel<1>, micro_kernel<2>, micro_kernel<3>,
                            micro_kernel<4>, micro_kernel<5>, micro_kernel<6>}};

// The first n lanes of a vector (none for n <= 0, all 16 for n >= 16).
AVX512 inline __mmask16 lanes(int64_t n) {
  return static_cast<__mmask16>((1u << std::clamp<int64_t>(n, 0, 16)) - 1);
}

// e^x for x <= 0, 16 lanes: the AVX2 file's Cephes steps, so each lane's value is the same.
AVX512 inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f),
                                                  _mm512_set1_ps(0.5f)),
                                  _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i bits = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

// A fixed tree: the two 256-bit halves, then halves again down to one lane.
AVX512 inline float hsum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// The cache lines of row[0:n] on their way to L1. Keys and values sit in blocks scattered over
// the pool, so the hardware prefetcher cannot guess the next block; the kernel can.
constexpr int64_t PREFETCH_KEYS = 16;  // how far ahead the weighted sum asks for value rows
AVX512 inline void prefetch_row(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(row + i), _MM_HINT_T0);
  }
}

// q . k as 16 lane sums: one fma chain over d in order (the last vector masked to d).
AVX512 inline __m512 dot_lanes(const float* q, const float* k, int64_t d) {
  const int64_t full = d / 16 * 16;
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < full; i += 16) {
    sum = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), sum);
  }
  if (full < d) {
    const __mmask16 tail = lanes(d - full);
    sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q + full),
                          _mm512_maskz_loadu_ps(tail, k + full), sum);
  }
  return sum;
}

// [hsum(v[0]), ..., hsum(v[15])] with hsum's own tree for every key, but all 16 keys share
// each level's shuffles and adds (15 of each instead of 4 x 16 for 16 hsums).
AVX512 __m512 reduce16(__m512 v[16]) {
  for (int i = 0; i < 8; ++i) {  // 16 lanes -> 8: [a.q0 a.q1 b.q0 b.q1] + [a.q2 a.q3 b.q2 b.q3]
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {  // 8 -> 4: [a.q0 b.q0 c.q0 d.q0] + [a.q1 b.q1 c.q1 d.q1]
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {  // 4 -> 2 in each 128-bit lane: [a0 a1 b0 b1] + [a2 a3 b2 b3]
    v[i] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xEE));
  }
  // 2 -> 1: lane 4L + m then holds key L + 4m; the permutation puts the keys in order.
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88),
                                    _mm512_shuffle_ps(v[0], v[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}

// scores[j0 + i] = scale * q . k_{j0 + i} for 16 keys; a key's score is the same bits as
// scale * hsum(dot_lanes(q, k)), the path the last nk % 16 keys take.
AVX512 void score16(const float* q, const float* keys, const int64_t* slots, int64_t d,
                    float scale, float* scores) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = dot_lanes(q, keys + slots[i] * d, d);
  _mm512_storeu_ps(scores, _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale)));
}

// o_g[0:n] = inv_g * sum_j p_g[j] * v_j[0:n] for G query heads at once (n <= 64, keys in
// order): every value vector is loaded once for all G heads, and 4G chains run side by side.
template <int G>
AVX512 void weighted_sum(const float* p, int64_t p_stride, const int64_t* slots, int64_t nk,
                         const float* values, int64_t d, const float* inv, float* o,
                         int64_t o_stride, int64_t n) {
  __mmask16 mask[4];
  __m512 acc[G][4];
  for (int c = 0; c < 4; ++c) mask[c] = lanes(n - 16 * c);
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < 4; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < nk; ++j) {
    const float* v = values + slots[j] * d;
    if (j + PREFETCH_KEYS < nk) prefetch_row(values + slots[j + PREFETCH_KEYS] * d, n);
    __m512 vj[4];
    for (int c = 0; c < 4; ++c) vj[c] = _mm512_maskz_loadu_ps(mask[c], v + 16 * c);
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * p_stride + j]);
      for (int c = 0; c < 4; ++c) acc[g][c] = _mm512_fmadd_ps(w, vj[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < 4; ++c) {
      _mm512_mask_storeu_ps(o + g * o_stride + 16 * c, mask[c],
                            _mm512_mul_ps(acc[g][c], _mm512_set1_ps(inv[g])));
    }
  }
}

using WeightedSum = void (*)(const float*, int64_t, const int64_t*, int64_t, const float*,
                             int64_t, const float*, float*, int64_t, int64_t);
constexpr int MAX_G = 4;  // 16 accumulators
constexpr WeightedSum WEIGHTED_SUMS[MAX_G + 1] = {nullptr, weighted_sum<1>, weighted_sum<2>,
                                                  weighted_sum<3>, weighted_sum<4>};

// Turn scores s[0:nk] into e^(s - max) in place (lanes up to the next 16 cleared); returns
// 1/sum. The sum runs in 16 lanes, so it rounds differently from the AVX2 file's.
AVX512 float softmax_weights(float* sg, int64_t nk) {
  __m512 most = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < nk; j += 16) {  // the max is exact in any order
    most = _mm512_max_ps(most, _mm512_mask_loadu_ps(most, lanes(nk - j), sg + j));
  }
  const float top = _mm512_reduce_max_ps(most);
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < nk; j += 16) {
    const __m512 e = _mm512_maskz_mov_ps(
        lanes(nk - j), exp_ps(_mm512_sub_ps(_mm512_loadu_ps(sg + j), _mm512_set1_ps(top))));
    _mm512_storeu_ps(sg + j, e);
    total = _mm512_add_ps(total, e);
  }
  return 1.0f / hsum(total);
}

AVX512 void attend_head(const HeadTask& t) {
  const int64_t d = t.dim, whole = t.nk / 16 * 16;
  for (int64_t j0 = 0; j0 < whole; j0 += 16) {  // 16 keys stay in L1 for all query heads
    for (int64_t j = j0 + 16; j < std::min(j0 + 32, t.nk); ++j) {
      prefetch_row(t.keys + t.slots[j] * d, d);
    }
    for (int64_t g = 0; g < t.group; ++g) {
      score16(t.q + g * t.q_head_stride, t.keys, t.slots + j0, d, t.scale,
              t.scores + g * t.score_stride + j0);
    }
  }
  for (int64_t j = whole; j < t.nk; ++j) {  // the last nk % 16 keys one by one
    const float* k = t.keys + t.slots[j] * d;
    for (int64_t g = 0; g < t.group; ++g) {
      const float score = hsum(dot_lanes(t.q + g * t.q_head_stride, k, d));
      t.scores[g * t.score_stride + j] = score * t.scale;
    }
  }
  float inv[MAX_G];
  for (int64_t g0 = 0; g0 < t.group; g0 += MAX_G) {  // query heads MAX_G at a time
    const int64_t heads = std::min<int64_t>(MAX_G, t.group - g0);
    float* sg = t.scores + g0 * t.score_stride;
    for (int64_t g = 0; g < heads; ++g) inv[g] = softmax_weights(sg + g * t.score_stride, t.nk);
    for (int64_t i = 0; i < d; i += 64) {
      WEIGHTED_SUMS[heads](sg, t.score_stride, t.slots, t.nk, t.values + i, d, inv,
                           t.out + g0 * d + i, d, std::min<int64_t>(64, d - i));
    }
  }
}

}  // namespace

// The entry points carry no attribute (they match kernels.h); what they call does.
const GemmTile& gemm_tile_avx512() { return TILE; }

void attend_head_avx512(const HeadTask& task) { attend_head(task); }

}  // namespace servelab
