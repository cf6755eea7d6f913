"""servelab's own CPU kernels (csrc/): a float32 linear layer, paged attention, and the row-wise
ops between a layer's GEMMs (RMSNorm, SiLU-and-multiply, RoPE with the KV write).

Built on first use with torch's C++ extension loader (a C++ compiler and ninja; under a
minute once, then cached by torch under a name of its own per source folder, so two checkouts
never wait on each other's build lock) and used for float32 on x86 CPUs with AVX2 and FMA. The inner
loops come in two instruction sets, chosen at run time: AVX-512 where the CPU has it, else
AVX2; SERVELAB_ISA=avx2|avx512 picks one (tests, benchmarks). Against the
torch path they replace (oneDNN linears, batched-matmul attention over gathered KV) they
stream weights faster at decode row counts and attend straight from the paged cache, and
each output element is computed by one fixed sequence of operations, so batch invariance
holds by construction rather than by padding rules.

Batch invariance holds within each ISA; between them the linear gives the same bits and
attention differs in the last bits (its sums run over 8 or 16 lanes).
SERVELAB_NATIVE=0 turns them off; a failed build warns once and falls back to the torch
path, which is also batch invariant (tests/executor runs both).
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
# The ops and tiling, a layer's row-wise ops, then the inner loops per ISA (kernels.h is what
# they share).
SOURCES = [CSRC / "kernels.cpp", CSRC / "layers.cpp", CSRC / "kernels_avx2.cpp",
           CSRC / "kernels_avx512.cpp"]
# The GEMM's row tiling, passed to kernels.cpp as -D flags. Up to SMALL_ROWS rows it streams
# every weight whole once per tile of MICRO_ROWS rows; past that it blocks the reduction and
# packs BLOCK_ROWS rows at a time. A decode step's time therefore climbs in steps with its
# rows, and the cost model's row knots sit where the slope changes.
GEMM_MICRO_ROWS = 6
GEMM_SMALL_ROWS = 2 * GEMM_MICRO_ROWS
GEMM_BLOCK_ROWS = 144
# Knots inside the first tile (1, 2, 4), at both sides of each tile edge, at the block size.
ROW_KNOTS = (1, 2, 4, GEMM_MICRO_ROWS, GEMM_MICRO_ROWS + 1, GEMM_SMALL_ROWS,
             GEMM_SMALL_ROWS + 1, GEMM_BLOCK_ROWS)
# The whole extension is compiled for AVX2; kernels_avx512.cpp marks its functions for AVX-512
# itself, and they run only where the CPU has it.
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp",  # OpenMP: at::parallel_for uses torch's threads
         f"-DSERVELAB_GEMM_MICRO_ROWS={GEMM_MICRO_ROWS}",
         f"-DSERVELAB_GEMM_SMALL_ROWS={GEMM_SMALL_ROWS}",
         f"-DSERVELAB_GEMM_BLOCK_ROWS={GEMM_BLOCK_ROWS}"]
ENV = "SERVELAB_NATIVE"
ISA_ENV = "SERVELAB_ISA"
ISAS = ("avx2", "avx512")  # slowest first; the default is the last one the CPU runs

_state: dict[str, object] = {"loaded": None, "tried": False, "enabled": True}


def cpu_supported() -> bool:
    """x86-64 with AVX2 and FMA (torch's own CPU capability probe)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()
    return capability in ("AVX2", "AVX512")


def _build():
    from torch.utils import cpp_extension

    try:  # the ninja wheel's binary, for a venv whose bin directory is not on PATH
        import ninja

        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
    except (ImportError, AttributeError):
        pass
    cpp_extension.load(name=_build_name(), sources=[str(p) for p in SOURCES],
                       extra_cflags=FLAGS,
                       is_python_module=False, verbose=False)
    return torch.ops.servelab


def _build_name() -> str:
    """The extension's name in torch's build cache: one per source folder. torch guards a build
    folder with a lock file that a build killed midway leaves behind, and every later build of
    that name then waits on it; a name per checkout keeps such a lock in the checkout that left it.
    """
    digest = hashlib.sha1(str(CSRC.resolve()).encode()).hexdigest()[:12]
    return f"servelab_kernels_{digest}"


def requested_isa() -> str | None:
    """SERVELAB_ISA if set (avx2 or avx512), else None; any other value is an error."""
    name = os.environ.get(ISA_ENV, "")
    if name and name not in ISAS:
        raise ValueError(f"{ISA_ENV}={name!r} is not an instruction set servelab's kernels "
                         f"have; use one of {', '.join(ISAS)} or leave it unset")
    return name or None


def _select_isa(ops, requested: str | None) -> None:
    """Run the kernels with the requested ISA, else the best one the CPU has."""
    supported = list(ops.cpu_isas())  # slowest first
    if requested is not None and requested not in supported:
        raise ValueError(f"{ISA_ENV}={requested}, but this CPU runs only "
                         f"{', '.join(supported)}")
    choice = requested or supported[-1]
    if ops.isa() != choice:
        ops.set_isa(choice)


def kernels():
    """The loaded op namespace (torch.ops.servelab), or None where the torch path is used.

    Each call applies SERVELAB_ISA (weights packed after it follow it)."""
    if not _state["enabled"] or os.environ.get(ENV, "1") == "0":
        return None
    requested = requested_isa()  # a bad value fails here even where the build would not
    if not _state["tried"]:
        _state["tried"] = True
        if cpu_supported():
            try:
                _state["loaded"] = _build()
            except Exception as error:  # no compiler, no ninja, a toolchain error: fall back
                warnings.warn(f"servelab's CPU kernels did not build ({error}); using the "
                              f"torch path (set {ENV}=0 to skip the attempt)", stacklevel=2)
    if _state["loaded"] is not None:
        _select_isa(_state["loaded"], requested)
    return _state["loaded"]


def enabled() -> bool:
    return kernels() is not None


def isa() -> str | None:
    """The instruction set the kernels run with (avx2 or avx512), None on the torch path."""
    ops = kernels()
    return None if ops is None else ops.isa()


@contextmanager
def disabled():
    """Use the torch path inside the block (tests compare both); pack weights inside it."""
    before = _state["enabled"]
    _state["enabled"] = False
    try:
        yield
    finally:
        _state["enabled"] = before
