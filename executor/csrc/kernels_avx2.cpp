// The AVX2 + FMA inner loops (8 float lanes): the GEMM micro-kernel on 16-column weight
// panels, one KV head of paged attention, and the row-wise steps of a decoder layer (RMSNorm,
// SiLU-and-multiply, RoPE; these run on either ISA). Compiled with the extension's -mavx2 -mfma.

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels.h"

namespace servelab {
namespace {

constexpr int64_t NR = 16;  // output columns per packed weight panel (two AVX vectors)

// 2R accumulators + 2 weights + 1 input stay in registers for the whole reduction.
template <int R>
void micro_kernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
                  bool accumulate) {
  __m256 lo[R], hi[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    lo[r] = accumulate ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    hi[r] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(b + kk * NR);
    const __m256 b1 = _mm256_loadu_ps(b + kk * NR + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + kk * MR + r);
      lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
      hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, lo[r]);
    _mm256_storeu_ps(c + r * ldc + 8, hi[r]);
  }
}

constexpr int64_t KC = 256;  // a [KC, NR] weight slice is 16 KiB: it stays in L1
constexpr GemmTile TILE = {NR, KC,
                           {nullptr, micro_kernel<1>, micro_kernel<2>, micro_kernel<3>,
                            micro_kernel<4>, micro_kernel<5>, micro_kernel<6>}};

// e^x for x <= 0, 8 lanes (Cephes' range reduction and polynomial, ~1 ulp).
inline __m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                             _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline float dot(const float* q, const float* k, int64_t d) {
  __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k));
  for (int64_t i = 8; i < d; i += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc);
  }
  return hsum(acc);
}

// o[0:8C] = inv * sum_j p[j] * v_j[0:8C], keys in order (C vectors held in registers).
template <int C>
void weighted_sum(const float* p, const int64_t* slots, int64_t nk, const float* values,
                  int64_t d, float inv, float* o) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < nk; ++j) {
    const __m256 w = _mm256_set1_ps(p[j]);
    const float* v = values + slots[j] * d;
    for (int c = 0; c < C; ++c) {
      acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * c), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    _mm256_storeu_ps(o + 8 * c, _mm256_mul_ps(acc[c], _mm256_set1_ps(inv)));
  }
}

// Turn scores s[0:nk] into e^(s - max) in place (lanes up to the next 8 cleared); returns 1/sum.
float softmax_weights(float* sg, int64_t nk) {
  const int64_t padded = (nk + 7) / 8 * 8;
  const float top = *std::max_element(sg, sg + nk);
  __m256 total = _mm256_setzero_ps();
  for (int64_t j = 0; j < padded; j += 8) {
    __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sg + j), _mm256_set1_ps(top)));
    if (j + 8 > nk) {  // lanes past the last key: zero, whatever the scratch held
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                               _mm256_set1_epi32(static_cast<int>(nk - j)), lane)));
    }
    _mm256_storeu_ps(sg + j, e);
    total = _mm256_add_ps(total, e);
  }
  return 1.0f / hsum(total);
}

}  // namespace

const GemmTile& gemm_tile_avx2() { return TILE; }

void attend_head_avx2(const HeadTask& t) {
  const int64_t d = t.dim;
  for (int64_t j = 0; j < t.nk; ++j) {
    const float* kj = t.keys + t.slots[j] * d;
    for (int64_t g = 0; g < t.group; ++g) {
      t.scores[g * t.score_stride + j] = dot(t.q + g * t.q_head_stride, kj, d) * t.scale;
    }
  }
  for (int64_t g = 0; g < t.group; ++g) {
    float* sg = t.scores + g * t.score_stride;
    const float inv = softmax_weights(sg, t.nk);
    float* o = t.out + g * d;
    int64_t i = 0;
    for (; i + 64 <= d; i += 64) weighted_sum<8>(sg, t.slots, t.nk, t.values + i, d, inv, o + i);
    for (; i < d; i += 8) weighted_sum<1>(sg, t.slots, t.nk, t.values + i, d, inv, o + i);
  }
}

void rms_norm_row(const float* x, const float* weight, int64_t dim, float eps, float* out) {
  const int64_t whole = dim / 8 * 8;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < whole; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float sum = hsum(acc);
  for (int64_t i = whole; i < dim; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
  const __m256 s = _mm256_set1_ps(inv);
  for (int64_t i = 0; i < whole; i += 8) {
    const __m256 normed = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i), normed));
  }
  for (int64_t i = whole; i < dim; ++i) out[i] = weight[i] * (x[i] * inv);
}

namespace {

// silu(g) * u for 8 lanes: g / (1 + e^-g), with e^-|g| so exp_ps stays in its range.
inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 e = exp_ps(_mm256_or_ps(g, sign));  // e^-|g|
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 positive = _mm256_div_ps(g, _mm256_add_ps(one, e));  // g >= 0
  const __m256 negative = _mm256_div_ps(_mm256_mul_ps(g, e), _mm256_add_ps(one, e));
  const __m256 silu = _mm256_blendv_ps(positive, negative, g);  // by g's sign bit
  return _mm256_mul_ps(silu, u);
}

}  // namespace

void silu_mul_row(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {  // the last n % 8 through a full vector, so they get the same arithmetic
    float g[8] = {}, u[8] = {}, o[8];
    std::copy(gate + i, gate + n, g);
    std::copy(up + i, up + n, u);
    _mm256_storeu_ps(o, silu_mul8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
    std::copy(o, o + (n - i), out + i);
  }
}

void rope_row(const float* x, const float* cos, const float* sin, int64_t heads, int64_t dim,
              float* out) {
  const int64_t half = dim / 2, whole = half / 8 * 8;
  for (int64_t h = 0; h < heads; ++h) {
    const float* x1 = x + h * dim;
    const float* x2 = x1 + half;
    float* o1 = out + h * dim;
    float* o2 = o1 + half;
    for (int64_t i = 0; i < whole; i += 8) {  // x1 c - x2 s, x2 c + x1 s
      const __m256 a = _mm256_loadu_ps(x1 + i), b = _mm256_loadu_ps(x2 + i);
      const __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
      _mm256_storeu_ps(o1 + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
      _mm256_storeu_ps(o2 + i, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
    }
    for (int64_t i = whole; i < half; ++i) {
      o1[i] = x1[i] * cos[i] - x2[i] * sin[i];
      o2[i] = x2[i] * cos[i] + x1[i] * sin[i];
    }
  }
}

}  // namespace servelab
