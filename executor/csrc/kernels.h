// What kernels.cpp (the torch ops: checks, tiling, threads) shares with the per-ISA inner
// loops in kernels_avx2.cpp and kernels_avx512.cpp. The ISA files include no ATen header:
// the AVX-512 one compiles its functions for AVX-512 through target attributes, and no inline
// function of a shared header must ever be compiled that way (the linker could keep that copy
// for every caller, which would then fault on an AVX2-only CPU).

#pragma once

#include <cstdint>

namespace servelab {

// The GEMM's row tiling comes from executor/native.py as -D flags (the cost model's row knots
// are derived from the same numbers there); both ISAs use it, only the panel width differs.
constexpr int64_t MR = SERVELAB_GEMM_MICRO_ROWS;  // rows per micro-kernel call
constexpr int64_t MC = SERVELAB_GEMM_BLOCK_ROWS;  // rows per packed input block: [MC, kc]
                                                  // is 144-288 KiB (L2)
constexpr int64_t SMALL_M = SERVELAB_GEMM_SMALL_ROWS;  // up to this many rows, no K blocking
constexpr int64_t MAX_NR = 64;  // the widest panel of any ISA (sizes the edge-tile buffer)
static_assert(MR == 6, "the micro-kernel tables list micro_kernel<1> .. micro_kernel<6>");

// C[R, NR] (+)= A[R, kc] B[kc, NR] for R = 1..MR rows: a is packed [kc][MR], b is a weight
// panel slice [kc][NR], c has row stride ldc. Every c[r, n] is one fma chain over k in order,
// so the result does not depend on R, on the ISA, or on the row's place in the tile.
using MicroKernel = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
                             bool accumulate);

struct GemmTile {
  int64_t nr;                   // output columns per packed weight panel
  int64_t kc;                   // reduction block past SMALL_M rows: [kc, nr] weight slices
  MicroKernel kernels[MR + 1];  // kernels[R] computes R rows; kernels[0] is unused
};

const GemmTile& gemm_tile_avx2();
const GemmTile& gemm_tile_avx512();

// One query row against one KV head: the `group` query heads at q (head stride q_head_stride)
// score the nk keys at keys + slots[j] * dim, softmax, and sum the values at the same slots
// into out[group][dim]. scores is scratch of group * score_stride floats, score_stride a
// multiple of 16 >= nk. Keys are visited in position order; the arithmetic depends only on
// this row's data, but differs between ISAs (8 or 16 lanes per partial sum).
struct HeadTask {
  const float* q;
  int64_t q_head_stride, group, dim, nk, score_stride;
  float scale;
  const float* keys;
  const float* values;
  const int64_t* slots;
  float* scores;
  float* out;
};

void attend_head_avx2(const HeadTask& task);
void attend_head_avx512(const HeadTask& task);

// A decoder layer's row-wise steps between the GEMMs (kernels_avx2.cpp). They run on AVX2 on
// either ISA, so their bits never depend on it; each reads and writes one row only.
// out = weight * (x * 1 / sqrt(mean(x^2) + eps)) over dim values, HF's RMSNorm op for op
// except the sum of squares: 8 lane sums in order, then a fixed tree.
void rms_norm_row(const float* x, const float* weight, int64_t dim, float eps, float* out);
// out[i] = silu(gate[i]) * up[i].
void silu_mul_row(const float* gate, const float* up, int64_t n, float* out);
// Rotary embedding of `heads` vectors of dim values (HF's rotate_half convention) from x to
// out, both with head stride dim; cos and sin hold dim / 2 values for this row's position.
void rope_row(const float* x, const float* cos, const float* sin, int64_t heads, int64_t dim,
              float* out);

}  // namespace servelab
