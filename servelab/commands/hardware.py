"""`servelab hardware` and `servelab models`: the GPUs and models a deployment can name."""

from __future__ import annotations

import argparse

from sim.specs.hardware import HARDWARE_SPECS, GiB, hardware_spec
from sim.specs.model_config import resolve_model, shipped_model_ids
from sim.specs.model_specs import MODEL_SPECS, ModelSpec


def register(subparsers: argparse._SubParsersAction) -> None:
    hardware = subparsers.add_parser(
        "hardware", help="list the GPU presets (or show a GPU file) with their sources",
        description="The GPUs --hardware names: peak dense FLOP/s, memory, links, price. "
        "Any other GPU is a JSON file in the same form (sim/specs/gpus/*.json).")
    hardware.add_argument("name", nargs="?", default=None,
                          help="show one GPU (a preset or a file) with the source of each number")
    hardware.set_defaults(func=_hardware)
    models = subparsers.add_parser(
        "models", help="list the model presets and the Hugging Face ids servelab ships",
        description="The models --model names: presets, Hugging Face ids whose config.json "
        "servelab ships (sim/specs/models/), or any config.json path.")
    models.add_argument("name", nargs="?", default=None,
                        help="show one model (a preset, an id or a config.json path)")
    models.set_defaults(func=_models)


def _hardware(args: argparse.Namespace) -> int:
    if args.name is not None:
        spec = hardware_spec(args.name)
        print(f"{spec.name}: {spec.description}")
        for key, source in spec.sources:
            print(f"  {key:<24}{source}")
        return 0
    print(f"{'name':<14}{'bf16 TFLOP/s':>13}{'fp8 TFLOP/s':>12}{'memory GiB':>11}"
          f"{'mem TB/s':>9}{'link GB/s':>10}{'$/hour':>7}  description")
    for spec in HARDWARE_SPECS.values():
        fp8 = "-" if spec.peak_fp8_flops is None else f"{spec.peak_fp8_flops / 1e12:.0f}"
        price = "-" if spec.usd_per_hour is None else f"{spec.usd_per_hour:g}"
        print(f"{spec.name:<14}{spec.peak_flops / 1e12:>13.0f}{fp8:>12}"
              f"{spec.memory_bytes / GiB:>11.1f}{spec.mem_bandwidth_bytes_s / 1e12:>9.2f}"
              f"{spec.interconnect_bytes_s / 1e9:>10.0f}{price:>7}  {spec.description}")
    return 0


def _models(args: argparse.Namespace) -> int:
    if args.name is not None:
        spec = resolve_model(args.name)
        print(_row(spec))
        for key, value in vars(spec).items():
            print(f"  {key:<34}{value}")
        return 0
    print(f"{'model':<42}{'params B':>9}{'active B':>9}{'layers':>7}{'heads/kv':>9}"
          f"{'experts':>8}{'KV KiB/token':>13}")
    for spec in [*MODEL_SPECS.values(), *map(resolve_model, shipped_model_ids())]:
        print(_row(spec))
    return 0


def _row(spec: ModelSpec) -> str:
    experts = f"{spec.num_experts_per_tok}/{spec.num_experts}" if spec.is_moe else "-"
    return (f"{spec.name:<42}{spec.num_params / 1e9:>9.2f}{spec.num_active_params / 1e9:>9.2f}"
            f"{spec.num_layers:>7}{f'{spec.num_heads}/{spec.num_kv_heads}':>9}{experts:>8}"
            f"{spec.kv_bytes_per_token(2) / 1024:>13.0f}")
