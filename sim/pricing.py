"""Which cost model prices a GPU deployment's steps (`--cost`): vLLM's measured kernels where
the GPU and version have tables, the fitted model, or the roofline; and the line that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.cost.gpu_cost import gpu_cost_backend
from sim.cost.kernel_cost import kernel_cost_backend
from sim.cost.kernel_tables import KernelTableError, KernelTables, measured_versions
from sim.cost.roofline import AnalyticCostModel
from sim.engine.core import Backend
from sim.specs.hardware import HardwareSpec
from sim.specs.model_specs import ModelSpec

if TYPE_CHECKING:
    from sim.deployment import DeploymentOptions, Parallelism

# --cost values: auto prices with vLLM's measured kernels where the GPU and version have
# tables (sim.cost.kernel_tables), else with the fitted model; kernels insists on tables.
COSTS = ("auto", "kernels", "gpu", "roofline")
# vLLM's measured kernels where the GPU has tables, else the fitted model (docs/kernels.md
# compares the two on whole vLLM runs).
DEFAULT_COST = "auto"


def pick_cost_model(options: DeploymentOptions, roofline: AnalyticCostModel, model: ModelSpec,
             hardware: HardwareSpec, parallel: Parallelism,
             dtype: str) -> tuple[Backend, str, str | None, str | None]:
    """The cost model --cost picks (the roofline sizes the pool either way), a line naming
    it (for the measured kernels, their GPU, vLLM version and source; for the fitted one,
    its notes after where GPU, model and shapes lie in its data), the fitted one's text
    before that coverage (None for the others), and the kernel tables' vLLM version."""
    name, quantization, kv = options.cost, options.quantization, options.kv_cache_dtype
    if name not in COSTS:
        raise ValueError(f"--cost {name!r}: choose {', '.join(COSTS)}")
    if options.vllm_version and name not in ("auto", "kernels"):
        raise ValueError(f"--vllm-version picks measured kernels; --cost {name} has none "
                         "(use --cost auto or kernels)")
    if name == "roofline":
        return roofline, "roofline", None, None
    ep = parallel.tensor_parallel * parallel.data_parallel if parallel.expert_parallel else 1
    fallback = ""
    if name in ("auto", "kernels"):
        try:
            tables = KernelTables.load(hardware.name, options.vllm_version)
            kernels = kernel_cost_backend(model, hardware, tables, parallel.tensor_parallel,
                                          expert_parallel=ep, dtype=dtype,
                                          quantization=quantization, kv_cache_dtype=kv)
            return kernels, f"vllm-kernels: {kernels.describe()}", None, tables.vllm_version
        except KernelTableError as error:
            # Asked for by name, or a version the GPU was not measured at: say so.
            if name == "kernels" or (options.vllm_version and measured_versions(hardware.name)):
                raise ValueError(f"--cost {name}: {error}") from None
            fallback = f"no measured vLLM kernels ({error}): extrapolated from the datasheet; "
    fitted = gpu_cost_backend(model, hardware, parallel.tensor_parallel, expert_parallel=ep,
                              quantization=quantization, kv_cache_dtype=kv)
    line = ""  # the notes after the coverage line, which the deployment states per budget
    if quantization:
        line += (f"; {quantization} GEMMs at the efficiencies fitted on 16-bit ones "
                 "(extrapolated)")
    if kv != "auto":
        line += (f"; {kv} KV cache read at the decode-attention efficiency fitted on 16-bit "
                 "KV (extrapolated)")
    return fitted, line, f"gpu-fitted: {fallback}", None
