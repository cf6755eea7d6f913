"""Formats users already have (inference-perf configs, ShareGPT, timed traces), spec errors
as one line naming the field, and the simulator's hit rate on inference-perf's example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.cli import main
from workloads import open_trace

SHARED_PREFIX = """\
load:
  type: {load}
  stages:
  - rate: 8
    duration: 30
  - rate: 20
    duration: 30
data:
  type: {data}
  shared_prefix:
    num_groups: 9
    num_prompts_per_group: 5
    system_prompt_len: 100
    question_len: 447
    output_len: 248
"""


def config(tmp_path: Path, load: str = "constant", data: str = "shared_prefix") -> str:
    path = tmp_path / "config.yml"
    path.write_text(SHARED_PREFIX.format(load=load, data=data))
    return str(path)


def error_of(capsys: pytest.CaptureFixture, *argv: str) -> str:
    assert main(["trace", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    return err


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("synthetic:users=5,rate=1,turns=fixed(3)", "think="),
        ("synthetic:users=5,rate=1,turns=fixed(3),think=fixed(-2)", "think="),
        ("synthetic:users=5,rate=1,turns=fixed(3),think=uniform(-1,3)", "think="),
        ("synthetic:n=10,rate=1,system=100,prompt=fixed(80)", "system=100"),
        ("synthetic:stages=rate(8)", "stages="),
        ("synthetic:stages=rate(8,10),n=5", "stages="),
        ("synthetic:n=10,rate=1,turns=fixed(3)", "turns="),
        ("synthetic:n=10,rate=1,prompt=fixed(9),question=fixed(9)", "question="),
        ("synthetic:n=10,rate=1,arrival=uniform", "arrival="),
    ],
)
def test_every_spec_error_is_one_line_naming_the_field(capsys, spec: str, field: str):
    assert field in error_of(capsys, spec)


def test_an_unknown_inference_perf_data_type_names_data_type(tmp_path: Path, capsys):
    err = error_of(capsys, config(tmp_path, data="shareGPT"))
    assert "data.type" in err and "shareGPT" in err


def test_an_unknown_load_type_names_load_type(tmp_path: Path, capsys):
    assert "load.type" in error_of(capsys, config(tmp_path, load="sweep"))


def test_multi_turn_inference_perf_is_refused_naming_the_option(tmp_path: Path, capsys):
    path = Path(config(tmp_path))
    path.write_text(path.read_text() + "    enable_multi_turn_chat: true\n")
    assert "enable_multi_turn_chat" in error_of(capsys, str(path))


def test_inference_perf_poisson_stages_and_random_data(tmp_path: Path):
    path = tmp_path / "random.yaml"
    path.write_text("load:\n  type: poisson\n  stages:\n  - {rate: 10, duration: 20}\n"
                    "data:\n  type: random\n  input_distribution: {min: 10, max: 100, "
                    "mean: 50, std_dev: 20}\n")
    trace = open_trace(str(path))
    assert 140 < len(trace) < 260 and trace.prompt_len.min() >= 10
    assert trace.prompt_len.max() <= 100 and not trace.has_prefix_hashes


def test_inference_perf_example_simulates_within_2_points_of_the_analytic_hit_rate(
        tmp_path: Path, capsys):
    out = tmp_path / "result.json"
    code = main(["simulate", "--trace", config(tmp_path), "--policy", "chunked",
                 "--model", "llama-3-8b", "--enable-prefix-caching", "--json", str(out)])
    capsys.readouterr()
    assert code == 0
    n = 8 * 30 + 20 * 30
    analytic = (9 * 4 * 96 + (n - 45) * 544) / (547 * n)  # docs/workloads.md derives it
    measured = json.loads(out.read_text())["results"]["chunked"]["prefix_cache_hit_rate"]
    assert abs(measured - analytic) < 0.02


def test_sharegpt_pairs_become_requests_at_time_zero(tmp_path: Path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "hello there"},
                                      {"from": "gpt", "value": "héllo"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "lonely"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "hi"},
                                      {"from": "gpt", "value": "long enough"}]},
    ]))
    trace = open_trace(str(path))
    assert trace.prompt_len.tolist() == [11] and trace.output_len.tolist() == [6]
    assert trace.arrival_s.tolist() == [0.0]


def test_sharegpt_bad_entry_names_it(tmp_path: Path, capsys):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"conversations": "nope"}]))
    assert "entry 1: conversations" in error_of(capsys, str(path))


def test_a_timed_trace_states_its_hash_block_size(tmp_path: Path, capsys):
    path = tmp_path / "timed.jsonl"
    rows = [{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]},
            {"timestamp": 500, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 4]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    saved = tmp_path / "out.jsonl"
    assert main(["trace", str(path), "--hash-block-tokens", "16", "--save", str(saved)]) == 0
    out, _ = capsys.readouterr()
    back = [json.loads(line) for line in saved.read_text().splitlines()]
    assert back[0]["prefix_hash_tokens"] == [16, 16, 8]
    assert "prefix_ceiling   0.4000" in out  # 32 of 80 prompt tokens: request 2's two blocks


def test_vllm_random_options_with_a_prefix(capsys):
    trace = open_trace("vllm:dataset_name=random,num_prompts=300,request_rate=5,"
                       "random_input_len=200,random_output_len=50,random_range_ratio=0.5,"
                       "--random-prefix-len=100")
    assert len(trace) == 300 and trace.prompt_len.min() >= 100 + 100
    assert trace.prompt_len.max() <= 100 + 300 and trace.output_len.max() <= 75
    assert {tuple(t) for t in trace.table["prefix_hash_tokens"]} == {(100,)}
    assert 40 < trace.span_s < 80


def test_vllm_prefix_repetition_and_the_default_infinite_rate():
    trace = open_trace("vllm:dataset_name=prefix_repetition,num_prompts=50,"
                       "prefix_repetition_prefix_len=64,prefix_repetition_suffix_len=32,"
                       "prefix_repetition_num_prefixes=5,prefix_repetition_output_len=8")
    assert (trace.arrival_s == 0).all() and (trace.prompt_len == 96).all()
    assert len({ids[0] for ids in trace.table["prefix_hash_ids"]}) == 5


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("vllm:dataset_name=sonnet", "dataset_name"),
        ("vllm:dataset_name=random,random_prefix=3", "random_prefix"),
        ("vllm:dataset_name=random,random_input_len=x", "random_input_len"),
        ("vllm:dataset_name=random,random_range_ratio=1.5", "random_range_ratio"),
    ],
)
def test_vllm_spec_errors_name_the_option(capsys, spec: str, field: str):
    assert field in error_of(capsys, spec)
