// servelab's CPU kernels (float32) as torch ops: a linear layer and paged attention, with
// inner loops for AVX2 + FMA (kernels_avx2.cpp) and AVX-512 (kernels_avx512.cpp) chosen at
// run time. This file holds what is ISA-neutral: input checks, tiling, threads, dispatch.
//
// Both are batch invariant by construction: every output element is one thread's fixed
// sequence of operations that depends only on that row's own data, never on how many rows
// share the call, how they are split between threads, or where the row sits in the batch.
//  - linear: y[m, n] = fma-chain over k = 0..K-1 in order (blocking over K stores the partial
//    sum and reloads it, which rounds nothing), then + bias.
//  - attention: one query row and KV head per task; keys are visited in position order.
// The ISA: the CPU's best unless set_isa picks one (executor/native.py passes SERVELAB_ISA).
// A weight is packed for the ISA in use, its panel width records which, and linear runs that
// ISA's micro-kernel on it; attention uses the ISA in use at the call. The guarantee holds
// within each ISA. Across ISAs the linear still gives the same bits (one fma chain per output
// either way); attention does not: its dot products and softmax sums run over 8 or 16 lanes.
// executor/native.py builds these files with torch's extension loader and falls back to the
// torch path (oneDNN linears, batched-matmul attention) when it cannot.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels.h"

namespace servelab {
namespace {

enum class Isa { avx2, avx512 };  // slowest first
constexpr const char* ISA_NAMES[] = {"avx2", "avx512"};

bool cpu_has(Isa isa) {
  __builtin_cpu_init();
  if (isa == Isa::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
}

// One per process, the best the CPU has until set_isa (native.py applies SERVELAB_ISA).
std::atomic<Isa>& isa_in_use() {
  static std::atomic<Isa> isa{cpu_has(Isa::avx512) ? Isa::avx512 : Isa::avx2};
  return isa;
}

// The ISAs this CPU runs, slowest first.
std::vector<std::string> cpu_isas() {
  std::vector<std::string> names;
  for (const Isa isa : {Isa::avx2, Isa::avx512}) {
    if (cpu_has(isa)) names.emplace_back(ISA_NAMES[static_cast<int>(isa)]);
  }
  return names;
}

std::string isa() { return ISA_NAMES[static_cast<int>(isa_in_use().load())]; }

// The ISA for weights packed from now on and for attention calls.
void set_isa(const std::string& name) {
  TORCH_CHECK(name == "avx2" || name == "avx512", "unknown ISA '", name,
              "': expected avx2 or avx512");
  const Isa isa = name == "avx512" ? Isa::avx512 : Isa::avx2;
  TORCH_CHECK(cpu_has(isa), "this CPU lacks ", name);
  isa_in_use().store(isa);
}

const GemmTile& gemm_tile(Isa isa) {
  return isa == Isa::avx512 ? gemm_tile_avx512() : gemm_tile_avx2();
}

void check_cpu_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name,
              " must be a float32 CPU tensor, got ", t.scalar_type(), " on ", t.device());
}

// W [N, K] (nn.Linear layout) -> [ceil(N / nr), K, nr] with the panel width nr of the ISA in
// use: each panel holds nr output columns, k-major, so the micro-kernel reads nr consecutive
// floats per k. Missing columns are zero.
at::Tensor pack_weight(const at::Tensor& weight) {
  check_cpu_float(weight, "weight");
  TORCH_CHECK(weight.dim() == 2, "weight must be 2-D [out, in], got ", weight.sizes());
  const int64_t nr = gemm_tile(isa_in_use().load()).nr;
  const auto w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1), panels = (n + nr - 1) / nr;
  auto packed = at::zeros({panels, k, nr}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t j = 0; j < nr && p * nr + j < n; ++j) {
        const float* row = src + (p * nr + j) * k;
        for (int64_t kk = 0; kk < k; ++kk) dst[(p * k + kk) * nr + j] = row[kk];
      }
    }
  });
  return packed;
}

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

// One thread's share of y = x W^T: output panels p0..p1-1 of y [m, n], for W packed in
// tile.nr-wide panels [*, k, nr] and x [m, k].
void gemm_panels(const GemmTile& tile, const float* a, const float* w, float* c, int64_t m,
                 int64_t n, int64_t k, int64_t p0, int64_t p1) {
  const int64_t nr = tile.nr;
  const int64_t rows = (std::min(m, MC) + MR - 1) / MR * MR;  // whole micro-panels
  std::vector<float> block(rows * (m <= SMALL_M ? k : tile.kc));
  for (int64_t m0 = 0; m0 < m; m0 += MC) {
    const int64_t mc = std::min(MC, m - m0);
    // Few rows: a weight panel is used once or twice, so stream it whole (blocking K would
    // read each panel in strided pieces); many rows: keep [tile.kc, nr] slices in cache.
    const int64_t kc_max = mc <= SMALL_M ? k : tile.kc;
    for (int64_t k0 = 0; k0 < k; k0 += kc_max) {
      const int64_t kc = std::min(kc_max, k - k0);
      pack_rows(a + m0 * k + k0, k, mc, kc, block.data());
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t ncols = std::min(nr, n - p * nr);
        const float* b = w + (p * k + k0) * nr;
        for (int64_t i = 0; i < mc; i += MR) {
          const int64_t r = std::min(MR, mc - i);
          float* out = c + (m0 + i) * n + p * nr;
          if (ncols == nr) {
            tile.kernels[r](kc, block.data() + i * kc, b, out, n, k0 > 0);
            continue;
          }
          // The last panel of an N that is not a multiple of nr: go through a full tile.
          float edge[MR * MAX_NR] = {};
          for (int64_t j = 0; j < r; ++j) {
            std::copy(out + j * n, out + j * n + ncols, edge + j * nr);
          }
          tile.kernels[r](kc, block.data() + i * kc, b, edge, nr, k0 > 0);
          for (int64_t j = 0; j < r; ++j) {
            std::copy(edge + j * nr, edge + j * nr + ncols, out + j * n);
          }
        }
      }
    }
  }
}

// The micro-kernels for a packed weight: its panel width says which ISA packed it.
const GemmTile& tile_for(const at::Tensor& packed) {
  const Isa isa = packed.size(2) == gemm_tile(Isa::avx512).nr ? Isa::avx512 : Isa::avx2;
  TORCH_CHECK(packed.size(2) == gemm_tile(isa).nr, "packed weight panels are ", packed.size(2),
              " wide; pack_weight makes ", gemm_tile(Isa::avx2).nr, " (avx2) or ",
              gemm_tile(Isa::avx512).nr, " (avx512)");
  TORCH_CHECK(cpu_has(isa), "the weight was packed for ", ISA_NAMES[static_cast<int>(isa)],
              ", which this CPU lacks");
  return gemm_tile(isa);
}

// y = x W^T + bias with W packed by pack_weight; x [M, K] -> y [M, n].
at::Tensor linear(const at::Tensor& input, const at::Tensor& packed,
                  const std::optional<at::Tensor>& bias, int64_t n) {
  check_cpu_float(input, "input");
  check_cpu_float(packed, "packed weight");
  TORCH_CHECK(input.dim() == 2, "input must be 2-D [rows, in], got ", input.sizes());
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == input.size(1),
              "packed weight ", packed.sizes(), " does not fit input ", input.sizes());
  const GemmTile& tile = tile_for(packed);
  const int64_t panels = packed.size(0);
  TORCH_CHECK(n > (panels - 1) * tile.nr && n <= panels * tile.nr, "n=", n,
              " does not match ", panels, " packed panels");
  const auto x = input.contiguous();
  const int64_t m = x.size(0), k = x.size(1);
  auto y = at::empty({m, n}, x.options());
  if (m > 0 && k == 0) y.zero_();
  if (m > 0 && k > 0) {
    const float* a = x.data_ptr<float>();
    const float* w = packed.data_ptr<float>();
    float* c = y.data_ptr<float>();
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
      gemm_panels(tile, a, w, c, m, n, k, p0, p1);
    });
  }
  if (bias.has_value() && bias->defined()) {
    check_cpu_float(*bias, "bias");
    y.add_(*bias);
  }
  return y;
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

// One query row (position pos) over its visible keys, every head: out[heads * dim].
void attend_row(const AttentionShape& s, void (*attend_head)(const HeadTask&), const float* q,
                const float* cache, const int64_t* table, int64_t pos, RowScratch& scratch,
                float* out) {
  const int64_t group = s.heads / s.kv_heads, d = s.dim;
  const int64_t first = s.window > 0 ? std::max<int64_t>(0, pos - s.window + 1) : 0;
  const int64_t nk = pos - first + 1, stride = (nk + 15) / 16 * 16;
  scratch.slots.resize(nk);
  scratch.scores.resize(group * stride);
  for (int64_t j = 0; j < nk; ++j) {
    const int64_t key = first + j;
    scratch.slots[j] = table[key / s.block_size] * s.block_size + key % s.block_size;
  }
  const int64_t head_size = s.num_blocks * s.block_size * d;  // one head's slab in the cache
  for (int64_t h = 0; h < s.kv_heads; ++h) {
    attend_head({q + h * group * s.q_head_stride, s.q_head_stride, group, d, nk, stride, s.scale,
                 cache + h * head_size, cache + (s.kv_heads + h) * head_size,
                 scratch.slots.data(), scratch.scores.data(), out + h * group * d});
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
  const auto attend_head =
      isa_in_use().load() == Isa::avx512 ? attend_head_avx512 : attend_head_avx2;
  at::parallel_for(0, parts, 1, [&](int64_t b0, int64_t b1) {
    RowScratch scratch;
    for (int64_t t = boundary(b0); t < std::min(boundary(b1), num_tokens); ++t) {
      attend_row(s, attend_head, qp + t * s.q_row_stride, cp, tp + sp[t] * s.table_width,
                 pp[t], scratch, op + t * s.heads * s.dim);
    }
  });
  return out;
}

}  // namespace
}  // namespace servelab

TORCH_LIBRARY(servelab, m) {
  m.def("cpu_isas", &servelab::cpu_isas);
  m.def("isa", &servelab::isa);
  m.def("set_isa", &servelab::set_isa);
  m.def("pack_weight", &servelab::pack_weight);
  m.def("linear", &servelab::linear);
  m.def("paged_attention", &servelab::paged_attention);
}
