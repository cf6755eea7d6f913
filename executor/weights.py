"""Build a Transformer from a preset (random init) or a Hugging Face checkpoint directory.

Checkpoints: config.json plus model.safetensors, or shards listed in
model.safetensors.index.json, for LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM.
Read with the safetensors package only; q/k/v and gate/up are fused into one matrix each.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from executor.config import ModelArgs
from executor.model import Transformer, init_weights

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry


class CheckpointError(ValueError):
    """A checkpoint directory that is missing files or tensors, or has wrong shapes."""


def empty_model(args: ModelArgs, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> Transformer:
    """A Transformer with uninitialized weights allocated directly on device in dtype."""
    with torch.device("meta"):
        model = Transformer(args)
    model = model.to(dtype=dtype).to_empty(device=device).eval()
    model.tie_weights()  # to_empty allocates the tied pair as two tensors
    return model


def random_model(args: ModelArgs, seed: int = 0, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> Transformer:
    """A randomly initialized model, the same weights for the same seed on any device."""
    model = empty_model(args, device, dtype)
    init_weights(model, seed)
    return model


def read_config(path: str | Path) -> ModelArgs:
    """ModelArgs from a checkpoint directory's config.json."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: no config.json (expected a Hugging Face model directory)")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_file}: invalid JSON ({exc})") from None
    return ModelArgs.from_hf_config(config, name=Path(path).name)


def _tensor_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return [path / name for name in sorted(set(weight_map.values()))]
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _read_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"{file}: shard listed in the index is missing")
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                yield name, handle.get_tensor(name)


def hf_targets(args: ModelArgs) -> dict[str, tuple[str, int, int]]:
    """HF tensor name -> (our parameter, first row, row count) inside the fused parameters."""
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    inter = args.intermediate_size
    targets = {"model.embed_tokens.weight": ("tok_embeddings", 0, args.vocab_size),
               "model.norm.weight": ("norm.weight", 0, args.dim)}
    if not args.tie_word_embeddings:
        targets["lm_head.weight"] = ("output.weight", 0, args.vocab_size)
    for i in range(args.n_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        kinds = ["weight", "bias"] if args.qkv_bias else ["weight"]
        for kind in kinds:
            fused = f"{ours}attention.wqkv.{kind}"
            targets[f"{hf}self_attn.q_proj.{kind}"] = (fused, 0, q)
            targets[f"{hf}self_attn.k_proj.{kind}"] = (fused, q, kv)
            targets[f"{hf}self_attn.v_proj.{kind}"] = (fused, q + kv, kv)
        targets[f"{hf}self_attn.o_proj.weight"] = (f"{ours}attention.wo.weight", 0, args.dim)
        targets[f"{hf}mlp.gate_proj.weight"] = (f"{ours}feed_forward.w_gate_up.weight", 0, inter)
        targets[f"{hf}mlp.up_proj.weight"] = (f"{ours}feed_forward.w_gate_up.weight", inter, inter)
        targets[f"{hf}mlp.down_proj.weight"] = (f"{ours}feed_forward.w_down.weight", 0, args.dim)
        targets[f"{hf}input_layernorm.weight"] = (f"{ours}attention_norm.weight", 0, args.dim)
        targets[f"{hf}post_attention_layernorm.weight"] = (f"{ours}ffn_norm.weight", 0, args.dim)
    return targets


def hf_config(args: ModelArgs) -> dict:
    """A config.json dict (LlamaForCausalLM, or Qwen2ForCausalLM with q/k/v biases) for args."""
    arch = "Qwen2ForCausalLM" if args.qkv_bias else "LlamaForCausalLM"
    if args.rope_scaling.rope_type != "default" or args.sliding_window is not None:
        raise ValueError(f"{args.name}: saving rope scaling or sliding windows is not supported")
    return {
        "architectures": [arch], "model_type": "qwen2" if args.qkv_bias else "llama",
        "hidden_size": args.dim, "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim,
        "vocab_size": args.vocab_size, "max_position_embeddings": args.max_position_embeddings,
        "rms_norm_eps": args.rms_norm_eps, "rope_theta": args.rope_theta,
        "tie_word_embeddings": args.tie_word_embeddings, "hidden_act": "silu",
    }


def save_hf_checkpoint(model: Transformer, path: str | Path) -> None:
    """Write config.json and model.safetensors with Hugging Face tensor names."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    params = dict(model.named_parameters())
    tensors = {}
    for name, (param_name, row, rows) in hf_targets(model.args).items():
        tensors[name] = params[param_name].detach().narrow(0, row, rows).cpu().contiguous()
    (path / "config.json").write_text(json.dumps(hf_config(model.args), indent=2))
    save_file(tensors, str(path / "model.safetensors"))


def load_hf_model(path: str | Path, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> Transformer:
    """Load a Llama/Qwen2/Mistral checkpoint directory into a packed, ready Transformer."""
    path = Path(path)
    args = read_config(path)
    files = _tensor_files(path)
    model = empty_model(args, device, dtype)
    params = dict(model.named_parameters())
    targets = hf_targets(args)
    loaded: set[str] = set()
    for name, tensor in _read_tensors(files):
        if name not in targets:
            tied_head = name == "lm_head.weight" and args.tie_word_embeddings
            if name.endswith(IGNORED_SUFFIXES) or tied_head:
                continue
            raise CheckpointError(f"{path}: unexpected tensor {name!r} for {args.name}")
        param_name, row, rows = targets[name]
        dest = params[param_name].data
        dest = dest.narrow(0, row, rows) if dest.dim() else dest
        if tuple(tensor.shape) != tuple(dest.shape):
            raise CheckpointError(f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                                  f"expected {tuple(dest.shape)}")
        dest.copy_(tensor.to(dtype))
        loaded.add(name)
    missing = sorted(set(targets) - loaded)
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise CheckpointError(f"{path}: missing tensor(s) {shown} ({len(missing)} in all)")
    model.pack_weights()
    return model
