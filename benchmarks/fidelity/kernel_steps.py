"""Step times of the fitted GPU model beside vLLM's measured kernels (sim.cost.kernel_cost).

    python benchmarks/fidelity/kernel_steps.py [--hardware h100] [--vllm-version 0.24.0]

For Llama-3.1-8B, Llama-3.1-70B at tp 4 and Qwen3-32B at tp 2: a decode step of 1, 32 and
256 rows at 1k context each, and one 2048-token prefill, in ms, old model then new.
"""

from __future__ import annotations

import argparse

from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import BatchPlan

MODELS = (("meta-llama/Llama-3.1-8B", 1), ("meta-llama/Llama-3.1-70B", 4),
          ("Qwen/Qwen3-32B", 2))
CONTEXT = 1024


def decode_plan(rows: int, context: int = CONTEXT) -> BatchPlan:
    """`rows` sequences decoding one token each over `context` KV tokens."""
    return BatchPlan(decode_seqs=rows, num_sampled=rows, decode_context=rows * context,
                     decode_context_max=context)


def prefill_plan(tokens: int) -> BatchPlan:
    """One whole prompt of `tokens` tokens, no cached context."""
    return BatchPlan(prefill_tokens=tokens, prefill_attn=tokens * tokens,
                     prefill_attn_causal=tokens * tokens - tokens * (tokens - 1) // 2,
                     prefill_seqs=1, prefill_chunk_max=tokens, prefill_context_max=tokens,
                     num_sampled=1)


STEPS = (("decode 1 @1k", decode_plan(1)), ("decode 32 @1k", decode_plan(32)),
         ("decode 256 @1k", decode_plan(256)), ("prefill 2048", prefill_plan(2048)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="h100")
    parser.add_argument("--vllm-version", default=None)
    args = parser.parse_args()
    print(f"{'model':<28}{'step':<16}{'gpu-fitted ms':>14}{'vllm-kernels ms':>17}{'new/old':>9}")
    for name, tp in MODELS:
        options = DeploymentOptions(model=name, hardware=args.hardware, tensor_parallel=tp,
                                    vllm_version=args.vllm_version)
        # the fitted model has no vLLM version to pick
        old = build_deployment(DeploymentOptions(**{**options.__dict__, "cost": "gpu",
                                                    "vllm_version": None}))
        new = build_deployment(DeploymentOptions(**{**options.__dict__, "cost": "kernels"}))
        label = f"{name.split('/')[-1]} tp{tp}"
        for step, plan in STEPS:
            a = old.cost_model.execute(plan).duration_s * 1e3
            b = new.cost_model.execute(plan).duration_s * 1e3
            print(f"{label:<28}{step:<16}{a:>14.2f}{b:>17.2f}{b / a:>9.2f}")
    print(f"new: {new.description.split('priced by ')[-1]}")


if __name__ == "__main__":
    main()
