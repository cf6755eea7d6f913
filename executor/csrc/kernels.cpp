// servelab's CPU kernels (float32, AVX2 + FMA): a linear layer and paged attention.
//
// Both are batch invariant by construction: every output element is one thread's fixed
// sequence of operations that depends only on that row's own data, never on how many rows
// share the call, how they are split between threads, or where the row sits in the batch.
//  - linear: y[m, n] = fma-chain over k = 0..K-1 in order (blocking over K stores the partial
//    sum and reloads it, which rounds nothing), then + bias.
//  - attention: one query row and KV head per task; keys are visited in position order.
// executor/native.py builds this file with torch's extension loader and falls back to the
// torch path (oneDNN linears, batched-matmul attention) when it cannot.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t NR = 16;   // output columns per packed weight panel (two AVX vectors)
// The row tiling comes from executor/native.py as -D flags (the cost model's row knots are
// derived from the same numbers there).
constexpr int64_t MR = SERVELAB_GEMM_MICRO_ROWS;  // rows per micro-kernel: 12 accumulators +
                                                  // 2 weights + 1 input
constexpr int64_t KC = 256;  // reduction block: a [KC, NR] weight slice is 16 KiB (L1)
constexpr int64_t MC = SERVELAB_GEMM_BLOCK_ROWS;  // rows per packed input block: [MC, KC] is
                                                  // 144 KiB (L2)
constexpr int64_t SMALL_M = SERVELAB_GEMM_SMALL_ROWS;  // up to this many rows, no K blocking
static_assert(MR == 6, "MICRO_KERNELS below lists micro_kernel<1> .. micro_kernel<6>");

void check_cpu_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name,
              " must be a float32 CPU tensor, got ", t.scalar_type(), " on ", t.device());
}

// W [N, K] (nn.Linear layout) -> [ceil(N / NR), K, NR]: each panel holds NR output columns,
// k-major, so the micro-kernel reads 16 consecutive floats per k. Missing columns are zero.
at::Tensor pack_weight(const at::Tensor& weight) {
  check_cpu_float(weight, "weight");
  TORCH_CHECK(weight.dim() == 2, "weight must be 2-D [out, in], got ", weight.sizes());
  const auto w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1), panels = (n + NR - 1) / NR;
  auto packed = at::zeros({panels, k, NR}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t j = 0; j < NR && p * NR + j < n; ++j) {
        const float* row = src + (p * NR + j) * k;
        for (int64_t kk = 0; kk < k; ++kk) dst[(p * k + kk) * NR + j] = row[kk];
      }
    }
  });
  return packed;
}

// C[R, NR] (+)= A[R, kc] B[kc, NR]: a is packed [kc][MR], b is a panel slice [kc][NR].
// The 2R accumulators stay in registers for the whole reduction.
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

using MicroKernel = void (*)(int64_t, const float*, const float*, float*, int64_t, bool);
constexpr MicroKernel MICRO_KERNELS[MR + 1] = {nullptr,         micro_kernel<1>, micro_kernel<2>,
                                               micro_kernel<3>, micro_kernel<4>, micro_kernel<5>,
                                               micro_kernel<6>};

// Copy x[m0:m0+mc, k0:k0+kc] into [ceil(mc / MR)][kc][MR] micro-panels (short panels 0-padded).
void pack_rows(const float* x, int64_t ldx, int64_t mc, int64_t kc, float* out) {
  for (int64_t i = 0; i < mc; i += MR) {
    const int64_t rows = std::min(MR, mc - i);
    float* panel = out + i * kc;
    for (int64_t kk = 0; kk < kc; ++kk) {
      for (int64_t r = 0; r < MR; ++r) {
        panel[kk * MR + r] = r < rows ? x[(i + r) * ldx + kk] : 0.0f;
      }
    }
  }
}

// y = x W^T + bias with W packed by pack_weight; x [M, K] -> y [M, n].
at::Tensor linear(const at::Tensor& input, const at::Tensor& packed,
                  const std::optional<at::Tensor>& bias, int64_t n) {
  check_cpu_float(input, "input");
  check_cpu_float(packed, "packed weight");
  TORCH_CHECK(input.dim() == 2, "input must be 2-D [rows, in], got ", input.sizes());
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == NR && packed.size(1) == input.size(1),
              "packed weight ", packed.sizes(), " does not fit input ", input.sizes());
  const int64_t panels = packed.size(0);
  TORCH_CHECK(n > (panels - 1) * NR && n <= panels * NR, "n=", n, " does not match ", panels,
              " packed panels");
  const auto x = input.contiguous();
  const int64_t m = x.size(0), k = x.size(1);
  auto y = at::empty({m, n}, x.options());
  if (m > 0 && k == 0) y.zero_();
  if (m > 0 && k > 0) {
    const float* a = x.data_ptr<float>();
    const float* w = packed.data_ptr<float>();
    float* c = y.data_ptr<float>();
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
      const int64_t rows = (std::min(m, MC) + MR - 1) / MR * MR;  // whole micro-panels
      std::vector<float> block(rows * (m <= SMALL_M ? k : KC));
      for (int64_t m0 = 0; m0 < m; m0 += MC) {
        const int64_t mc = std::min(MC, m - m0);
        // Few rows: a weight panel is used once or twice, so stream it whole (blocking K
        // would read each panel in strided pieces); many rows: keep [KC, NR] slices in L1.
        const int64_t kc_max = mc <= SMALL_M ? k : KC;
        for (int64_t k0 = 0; k0 < k; k0 += kc_max) {
          const int64_t kc = std::min(kc_max, k - k0);
          pack_rows(a + m0 * k + k0, k, mc, kc, block.data());
          for (int64_t p = p0; p < p1; ++p) {
            const int64_t ncols = std::min(NR, n - p * NR);
            const float* b = w + (p * k + k0) * NR;
            for (int64_t i = 0; i < mc; i += MR) {
              const int64_t rows = std::min(MR, mc - i);
              float* out = c + (m0 + i) * n + p * NR;
              if (ncols == NR) {
                MICRO_KERNELS[rows](kc, block.data() + i * kc, b, out, n, k0 > 0);
                continue;
              }
              // The last panel of an N that is not a multiple of NR: go through a full tile.
              float tile[MR * NR] = {};
              for (int64_t r = 0; r < rows; ++r) {
                std::copy(out + r * n, out + r * n + ncols, tile + r * NR);
              }
              MICRO_KERNELS[rows](kc, block.data() + i * kc, b, tile, NR, k0 > 0);
              for (int64_t r = 0; r < rows; ++r) {
                std::copy(tile + r * NR, tile + r * NR + ncols, out + r * n);
              }
            }
          }
        }
      }
    });
  }
  if (bias.has_value() && bias->defined()) {
    check_cpu_float(*bias, "bias");
    y.add_(*bias);
  }
  return y;
}

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

struct AttentionShape {
  int64_t heads, kv_heads, dim, num_blocks, block_size, table_width;
  int64_t q_row_stride, q_head_stride;
  float scale;
  int64_t window;  // 0: none; else a query at p sees keys p - window + 1 .. p
};

// Scratch reused across one thread's rows: key slots and scores.
struct RowScratch {
  std::vector<int64_t> slots;
  std::vector<float> scores;
};

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

// One query row (position pos) over its visible keys, every head: out[heads * dim].
void attend_row(const AttentionShape& s, const float* q, const float* cache,
                const int64_t* table, int64_t pos, RowScratch& scratch, float* out) {
  const int64_t group = s.heads / s.kv_heads, d = s.dim;
  const int64_t first = s.window > 0 ? std::max<int64_t>(0, pos - s.window + 1) : 0;
  const int64_t nk = pos - first + 1, padded = (nk + 7) / 8 * 8;
  scratch.slots.resize(nk);
  scratch.scores.resize(group * padded);
  for (int64_t j = 0; j < nk; ++j) {
    const int64_t key = first + j;
    scratch.slots[j] = table[key / s.block_size] * s.block_size + key % s.block_size;
  }
  const int64_t head_size = s.num_blocks * s.block_size * d;  // one head's slab in the cache
  for (int64_t h = 0; h < s.kv_heads; ++h) {
    const float* keys = cache + h * head_size;
    const float* values = cache + (s.kv_heads + h) * head_size;
    for (int64_t j = 0; j < nk; ++j) {
      const float* kj = keys + scratch.slots[j] * d;
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = q + (h * group + g) * s.q_head_stride;
        scratch.scores[g * padded + j] = dot(qg, kj, d) * s.scale;
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      float* sg = scratch.scores.data() + g * padded;
      const float inv = softmax_weights(sg, nk);
      float* o = out + (h * group + g) * d;
      const int64_t* slots = scratch.slots.data();
      int64_t i = 0;
      for (; i + 64 <= d; i += 64) weighted_sum<8>(sg, slots, nk, values + i, d, inv, o + i);
      for (; i < d; i += 8) weighted_sum<1>(sg, slots, nk, values + i, d, inv, o + i);
    }
  }
}

// Causal attention of every step row over the paged cache (this step's keys already written).
// q [P, heads, dim] (rows may be strided), cache [2 * kv_heads, blocks, block_size, dim],
// tables [S, width] block ids per sequence, row_seq [T] and positions [>= T] per real row.
// Returns [P, heads * dim]; rows T..P-1 (linear-layer padding) are zeros.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& cache,
                           const at::Tensor& tables, const at::Tensor& row_seq,
                           const at::Tensor& positions, int64_t num_tokens, double scale,
                           int64_t window) {
  check_cpu_float(q, "q");
  check_cpu_float(cache, "cache");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1,
              "q must be [rows, heads, dim] with dim contiguous");
  TORCH_CHECK(cache.dim() == 4 && cache.is_contiguous() && cache.size(3) == q.size(2),
              "cache must be contiguous [2 * kv_heads, blocks, block_size, dim]");
  TORCH_CHECK(q.size(2) % 8 == 0, "head_dim must be a multiple of 8, got ", q.size(2));
  TORCH_CHECK(q.size(1) % (cache.size(0) / 2) == 0, "heads must be a multiple of kv heads");
  TORCH_CHECK(tables.scalar_type() == at::kLong && row_seq.scalar_type() == at::kLong &&
                  positions.scalar_type() == at::kLong,
              "tables, row_seq and positions must be int64");
  TORCH_CHECK(num_tokens <= q.size(0) && row_seq.numel() >= num_tokens &&
                  positions.numel() >= num_tokens, "num_tokens exceeds the rows given");
  const AttentionShape s{q.size(1),      cache.size(0) / 2, q.size(2),    cache.size(1),
                         cache.size(2),  tables.size(1),    q.stride(0),  q.stride(1),
                         static_cast<float>(scale), window};
  auto out = num_tokens == q.size(0) ? at::empty({q.size(0), s.heads * s.dim}, q.options())
                                     : at::zeros({q.size(0), s.heads * s.dim}, q.options());
  const auto tab = tables.contiguous();
  const auto seq = row_seq.contiguous();
  const auto pos = positions.contiguous();
  const int64_t* tp = tab.data_ptr<int64_t>();
  const int64_t* sp = seq.data_ptr<int64_t>();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const float* qp = q.data_ptr<float>();
  const float* cp = cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t t = 0; t < num_tokens; ++t) {  // every block a row reads must be in the pool
    TORCH_CHECK(sp[t] >= 0 && sp[t] < tab.size(0), "row ", t, " has no block table");
    TORCH_CHECK(pp[t] >= 0 && pp[t] / s.block_size < s.table_width, "row ", t, " position ",
                pp[t], " is outside its block table");
    const int64_t* table = tp + sp[t] * s.table_width;
    for (int64_t b = 0; b <= pp[t] / s.block_size; ++b) {
      TORCH_CHECK(table[b] >= 0 && table[b] < s.num_blocks, "row ", t, " reads block ",
                  table[b], " of a ", s.num_blocks, "-block cache");
    }
  }
  // Split rows between threads by the keys they read, so a long prefill chunk does not leave
  // one thread with most of the work. The split never changes any row's arithmetic.
  std::vector<int64_t> cost(num_tokens + 1, 0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t keys = s.window > 0 ? std::min(pp[t] + 1, s.window) : pp[t] + 1;
    cost[t + 1] = cost[t] + keys + 8;
  }
  const int64_t parts =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_tokens));
  auto boundary = [&](int64_t b) {
    return std::lower_bound(cost.begin(), cost.end(), cost.back() * b / parts) - cost.begin();
  };
  at::parallel_for(0, parts, 1, [&](int64_t b0, int64_t b1) {
    RowScratch scratch;
    for (int64_t t = boundary(b0); t < std::min(boundary(b1), num_tokens); ++t) {
      attend_row(s, qp + t * s.q_row_stride, cp, tp + sp[t] * s.table_width, pp[t], scratch,
                 op + t * s.heads * s.dim);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(servelab, m) {
  m.def("pack_weight", &pack_weight);
  m.def("linear", &linear);
  m.def("paged_attention", &paged_attention);
}
