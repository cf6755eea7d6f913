"""A Linear layer whose rows never depend on how many rows share the call (batch invariance).

On x86 CPUs with AVX2, float32 weights go to servelab's own kernel (executor/native.py):
invariant by construction, as fast as oneDNN for prefill and faster for decode-sized row
counts. Without it, oneDNN: on CPU, torch's default GEMM (MKL sgemm) picks a different kernel
for 1, 2 and 3 rows than for 4 and more, so a token's activations change in the last bits
with the batch it runs in, which can flip a greedy argmax. oneDNN with a weight prepacked
once gives bitwise the same row for any row count of two or more (a lone row runs as a
pair) and is as fast as GEMV for one row, where MKL's small-M GEMM is 3-5x slower.
`pack()` picks the path; tests/executor check both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from executor import native


def onednn_available() -> bool:
    """Whether this torch build can prepack CPU weights for oneDNN."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class Linear(nn.Module):
    """y = x W^T + b, with W [out_features, in_features] as in nn.Linear and HF checkpoints."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        )
        self._packed: torch.Tensor | None = None  # oneDNN blocked layout of weight (CPU only)
        self._panels: torch.Tensor | None = None  # the native kernel's layout (CPU only)

    def pack(self) -> None:
        """Prepack the weight for the native kernel, else oneDNN (CPU float32); a no-op
        elsewhere (CUDA, bf16, fp16)."""
        w = self.weight
        self._packed = self._panels = None
        if w.device.type != "cpu" or w.dtype != torch.float32:
            return
        ops = native.kernels()
        if ops is not None:
            self._panels = ops.pack_weight(w.detach())
            return
        if not onednn_available():
            raise RuntimeError("this torch build lacks oneDNN, needed for batch-invariant linears")
        self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)

    def unpack(self) -> None:
        """Drop the packed copy (call after changing the weight, then pack again)."""
        self._packed = self._panels = None

    @property
    def is_native(self) -> bool:
        return self._panels is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in_features] -> [T, out_features]
        if self._panels is not None:
            return torch.ops.servelab.linear(x, self._panels, self.bias, self.out_features)
        if self._packed is not None:
            if x.shape[0] == 1:
                # oneDNN gives a lone row its own GEMV path on some CPUs (an AMD EPYC, with
                # 1408 inputs), whose sums differ in the last bits from the same row among
                # others: it runs as a pair instead.
                return self._onednn(x.expand(2, -1).contiguous())[:1]
            return self._onednn(x)
        return F.linear(x, self.weight, self.bias)

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        packed = ", native" if self.is_native else ", packed" if self._packed is not None else ""
        bias = self.bias is not None
        return f"in={self.in_features}, out={self.out_features}, bias={bias}{packed}"
