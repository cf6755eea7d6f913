// A decoder layer's steps between its GEMMs as torch ops, one call each where the torch path
// takes several: RMSNorm (with the residual add before it), SiLU-and-multiply, and RoPE with
// the KV cache write. On the peer model's decode steps these small ops, each a few
// microseconds of dispatch and a pass over memory, took about a sixth of the step.
// Every output row depends only on the same row of the inputs (kernels_avx2.cpp computes one
// row at a time), so batch invariance holds however the rows are split between threads.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "kernels.h"

namespace servelab {
namespace {

// Rows per thread chunk: about 32K values, torch's grain for elementwise ops, so decode-sized
// steps stay on the calling thread.
int64_t row_grain(int64_t row_values) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_values));
}

void check_rows(const at::Tensor& t, const char* name, int64_t width) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name,
              " must be a float32 CPU tensor, got ", t.scalar_type(), " on ", t.device());
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), name, " must be contiguous [rows, width], got ",
              t.sizes());
  TORCH_CHECK(width < 0 || t.size(1) == width, name, " has ", t.size(1), " columns, expected ",
              width);
}

void check_weight(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == at::kFloat &&
                  weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == x.size(1),
              "weight must be a contiguous float32 CPU vector of ", x.size(1), " values");
}

// weight * (x / rms(x)) per row of x [T, dim].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x", -1);
  check_weight(x, weight);
  auto out = at::empty_like(x);
  const int64_t dim = x.size(1);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, x.size(0), row_grain(dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      rms_norm_row(xp + r * dim, wp, dim, static_cast<float>(eps), op + r * dim);
    }
  });
  return out;
}

// (rms_norm(x + residual), x + residual): the sum is the stream the next layer adds to.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  check_rows(x, "x", -1);
  check_rows(residual, "residual", x.size(1));
  TORCH_CHECK(residual.size(0) == x.size(0), "x has ", x.size(0), " rows, residual ",
              residual.size(0));
  check_weight(x, weight);
  auto sum = at::empty_like(x);
  auto out = at::empty_like(x);
  const int64_t dim = x.size(1);
  const float* xp = x.data_ptr<float>();
  const float* rp = residual.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* sp = sum.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, x.size(0), row_grain(dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < dim; ++i) sp[r * dim + i] = rp[r * dim + i] + xp[r * dim + i];
      rms_norm_row(sp + r * dim, wp, dim, static_cast<float>(eps), op + r * dim);
    }
  });
  return {out, sum};
}

// silu(gate) * up for gate_up [T, 2 I] (gate the first I columns) -> [T, I].
at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up", -1);
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up must have an even number of columns");
  const int64_t n = gate_up.size(1) / 2;
  auto out = at::empty({gate_up.size(0), n}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, gate_up.size(0), row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      silu_mul_row(gp + r * 2 * n, gp + r * 2 * n + n, n, op + r * n);
    }
  });
  return out;
}

// qkv [P, (heads + 2 kv_heads) * dim] (q, k, v heads in that order) with cos, sin [P, dim / 2]
// for each row's position: returns the rotated queries [P, heads, dim] and stores the rotated
// keys and the values of rows 0..num_tokens-1 at their slots of one layer's cache
// [2 * kv_heads, blocks, block_size, dim] (K heads, then V heads). Query rows past num_tokens
// (linear-layer padding) are zeros.
at::Tensor rope_write_kv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& cache, const at::Tensor& slots, int64_t num_tokens,
                         int64_t heads) {
  TORCH_CHECK(cache.device().is_cpu() && cache.scalar_type() == at::kFloat &&
                  cache.dim() == 4 && cache.is_contiguous(),
              "cache must be a contiguous float32 [2 * kv_heads, blocks, block_size, dim]");
  const int64_t kv_heads = cache.size(0) / 2, dim = cache.size(3);
  const int64_t num_slots = cache.size(1) * cache.size(2), rows = qkv.size(0);
  TORCH_CHECK(dim % 2 == 0, "head_dim must be even, got ", dim);
  check_rows(qkv, "qkv", (heads + 2 * kv_heads) * dim);
  check_rows(cos, "cos", dim / 2);
  check_rows(sin, "sin", dim / 2);
  TORCH_CHECK(cos.size(0) >= rows && sin.size(0) >= rows, "cos and sin need ", rows, " rows");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() &&
                  num_tokens <= rows && slots.numel() >= num_tokens,
              "slots must be int64 with one entry per token (", num_tokens, " of ", rows,
              " rows)");
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_tokens; ++t) {
    TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "row ", t, " writes slot ", sp[t], " of a ",
                num_slots, "-slot cache");
  }
  auto q = num_tokens == rows ? at::empty({rows, heads, dim}, qkv.options())
                               : at::zeros({rows, heads, dim}, qkv.options());
  const int64_t width = qkv.size(1), head_slab = num_slots * dim;
  const float* xp = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* snp = sin.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kv = cache.data_ptr<float>();
  at::parallel_for(0, num_tokens, row_grain(width), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = xp + t * width;
      const float* c = cp + t * (dim / 2);
      const float* s = snp + t * (dim / 2);
      rope_row(row, c, s, heads, dim, qp + t * heads * dim);
      for (int64_t h = 0; h < kv_heads; ++h) {
        rope_row(row + (heads + h) * dim, c, s, 1, dim, kv + h * head_slab + sp[t] * dim);
        const float* v = row + (heads + kv_heads + h) * dim;
        std::copy(v, v + dim, kv + (kv_heads + h) * head_slab + sp[t] * dim);
      }
    }
  });
  return q;
}

}  // namespace
}  // namespace servelab

TORCH_LIBRARY_FRAGMENT(servelab, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &servelab::rms_norm);
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
        &servelab::add_rms_norm);
  m.def("silu_mul(Tensor gate_up) -> Tensor", &servelab::silu_mul);
  m.def("rope_write_kv(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) cache, Tensor slots, "
        "int num_tokens, int heads) -> Tensor",
        &servelab::rope_write_kv);
}
