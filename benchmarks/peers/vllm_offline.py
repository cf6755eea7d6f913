"""vLLM's offline engine on a token-id workload: wall seconds of each full LLM.generate() call.

The script runs inside the vLLM venv (its python, no servelab imports). It reads a JSON workload
{"prompts": [[ids]], "outputs": [n]}, builds vllm.LLM (fp32, prefix caching off so repeats do not
hit cached prompts), generates the whole workload once to warm up, then greedily with EOS ignored
and exactly n tokens per request: --repeats N generates back to back, or --stdin one per line read
from stdin, each answered with a JSON line on stdout. At the end it writes
{"walls_s": [...], "tokens": {"r0": [ids], ...}, "startup_s", "warmup_s", "vllm"} to OUT.
Run: .venv-vllm/bin/python benchmarks/peers/vllm_offline.py WORKLOAD.json OUT.json --model DIR
Import (servelab's venv): `with start_offline_peer(...) as peer: tokens, wall_s = peer.generate()`
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from vllm_server import (
    ROOT,
    VllmConfig,
    ensure_checkpoint,
    ensure_venv,
    log_tail,
    server_env,
    wait_or_kill,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", type=Path, help='JSON {"prompts": [[ids]], "outputs": [n]}')
    parser.add_argument("out", type=Path, help="JSON written at the end")
    parser.add_argument("--model", type=Path, required=True, help="HF checkpoint folder")
    parser.add_argument("--repeats", type=int, default=3, help="generates (ignored with --stdin)")
    parser.add_argument("--stdin", action="store_true", help="one generate per line on stdin")
    parser.add_argument("--eager", action="store_true", help="enforce_eager: no graph capture")
    parser.add_argument("--max-model-len", type=int, default=2048)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # Answers go to the real stdout; everything else written to fd 1 from here on (vLLM's logs,
    # its engine-core process, which inherits the fd) goes to stderr, so answers stay parseable.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    workload = json.loads(args.workload.read_text())
    prompts: list[list[int]] = workload["prompts"]
    outputs: list[int] = workload["outputs"]
    if len(prompts) != len(outputs) or not prompts:
        raise ValueError(f"{args.workload}: needs as many prompts as outputs, at least one")

    start = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(args.model), dtype="float32", seed=0, max_model_len=args.max_model_len,
              max_num_seqs=max(32, len(prompts)), enable_prefix_caching=False,
              enforce_eager=args.eager, skip_tokenizer_init=True)
    requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    # No detokenizing: the systems vLLM is compared with return token ids only.
    params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True,
                             detokenize=False) for n in outputs]
    startup_s = time.perf_counter() - start

    def generate() -> tuple[float, dict[str, list[int]]]:
        begin = time.perf_counter()
        results = llm.generate(requests, params, use_tqdm=False)
        wall_s = time.perf_counter() - begin
        return wall_s, {f"r{i}": list(r.outputs[0].token_ids) for i, r in enumerate(results)}

    warmup_s, _ = generate()
    _answer(answers, {"ready": True, "vllm": vllm.__version__, "startup_s": startup_s,
                      "warmup_s": warmup_s})
    walls_s: list[float] = []
    tokens: dict[str, list[int]] = {}
    for _ in sys.stdin if args.stdin else range(args.repeats):
        wall_s, tokens = generate()
        walls_s.append(wall_s)
        _answer(answers, {"wall_s": wall_s, "tokens": tokens} if args.stdin else {"wall_s": wall_s})
    result = {"vllm": vllm.__version__, "startup_s": startup_s, "warmup_s": warmup_s,
              "walls_s": walls_s, "tokens": tokens}
    args.out.write_text(json.dumps(result) + "\n")


def _answer(stream: TextIO, record: dict) -> None:
    stream.write(json.dumps(record) + "\n")
    stream.flush()


# The driver: runs in servelab's venv and starts the script above as a --stdin child.


@dataclass
class OfflinePeer:
    """A warmed-up vllm_offline.py --stdin child; generate() times one run of its workload."""

    process: subprocess.Popen
    log_path: Path
    timeout_s: float
    info: dict = field(default_factory=dict)  # the "ready" answer: vllm, startup_s, warmup_s

    def generate(self) -> tuple[dict[str, list[int]], float]:
        """Outputs by request id and the wall seconds of one LLM.generate, timed in the child."""
        assert self.process.stdin is not None
        self.resume()
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        answer = self.read_answer()
        self.pause()
        return answer["tokens"], answer["wall_s"]

    def pause(self) -> None:
        """Stop vLLM's processes between its runs: its shared-memory readers busy-poll after
        their last message (SpinCondition.busy_loop_s) and its engine core keeps polling,
        which would take a core from whatever is timed next."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def read_answer(self) -> dict:
        """The child's next JSON line; raises if it exits or says nothing within timeout_s."""
        assert self.process.stdout is not None
        if not select.select([self.process.stdout], [], [], self.timeout_s)[0]:
            raise TimeoutError(f"vllm_offline: no answer in {self.timeout_s:.0f} s; "
                               f"log {self.log_path}:\n{log_tail(self.log_path)}")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"vllm_offline exited with code {self.process.wait()}; "
                               f"log {self.log_path}:\n{log_tail(self.log_path)}")
        return json.loads(line)

    def close(self, timeout_s: float = 60.0) -> None:
        """EOF on stdin ends the child's loop; kill its process group if it lingers."""
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.resume()
            self.process.stdin.close()
            wait_or_kill(self.process, timeout_s)

    def __enter__(self) -> OfflinePeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_offline_peer(venv: Path, model_dir: Path, prompts: list[list[int]], outputs: list[int],
                       cores: list[int], workdir: Path, kv_cache_gib: int = 1,
                       timeout_s: float = 900.0) -> OfflinePeer:
    """Install vLLM and the checkpoint if needed, start the child on `cores`, wait until warm."""
    python = ensure_venv(venv)
    ensure_checkpoint(model_dir)
    workload = workdir / "vllm-workload.json"
    workload.write_text(json.dumps({"prompts": prompts, "outputs": outputs}))
    env = server_env(venv, VllmConfig(venv=venv, kv_cache_gib=kv_cache_gib,
                                      cpus=",".join(map(str, cores))))
    for key in ("OMP_PROC_BIND", "OMP_PLACES"):  # servelab's pinning; vLLM binds its own threads
        env.pop(key, None)
    log_path = ROOT / "out" / "vllm-offline.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(python), str(Path(__file__).resolve()), str(workload),
           str(workdir / "vllm-out.json"), "--model", str(model_dir), "--stdin"]
    # A child inherits the spawning thread's affinity, and torch's OpenMP binds this one to a
    # single core: widen it to `cores` for the spawn only.
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        with log_path.open("w") as log:
            process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=log, text=True, env=env, cwd=ROOT,
                                       start_new_session=True)
    finally:
        os.sched_setaffinity(0, mine)
    peer = OfflinePeer(process, log_path, timeout_s)
    try:
        peer.info = peer.read_answer()
        peer.pause()
    except BaseException:
        peer.close(timeout_s=5.0)
        raise
    return peer


if __name__ == "__main__":
    try:
        main()
    except (ValueError, KeyError, OSError) as exc:
        sys.exit(f"vllm_offline: {exc}")
