"""An exchange over more GPUs than a node holds: the node's own all-reduce plus a ring among
the nodes over each GPU's network share (sim.cost.gpu_terms.across_nodes_s), in the fitted
and the measured-kernel models alike; a GPU without a network figure refuses it by name."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sim.cost.gpu_terms import across_nodes_s
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import BatchPlan
from sim.specs.hardware import GPUS_DIR, hardware_spec

H100 = hardware_spec("h100")


def test_within_a_node_nothing_crosses_the_network():
    assert across_nodes_s(H100, 1e6, 8) == 0.0
    assert across_nodes_s(replace(H100, network_bytes_s=None, network_latency_s=None),
                          1e6, 8) == 0.0


def test_two_nodes_ring_each_gpus_slice_over_its_nic():
    # 2 nodes of 8: 2 hops of 10 us, and 2 x 1/2 of the 1/8 slice at 50 GB/s.
    message = 64e6
    expected = 2 * 10e-6 + (message / 8) / 50e9
    assert across_nodes_s(H100, message, 16) == pytest.approx(expected)
    # Four nodes: more hops, a larger share of the slice on the wire.
    assert across_nodes_s(H100, message, 32) > across_nodes_s(H100, message, 16)


def test_a_gpu_without_a_network_refuses_an_exchange_across_nodes():
    bare = replace(H100, network_bytes_s=None, network_latency_s=None)
    with pytest.raises(ValueError, match="spans nodes of 8.*network_bytes_s"):
        across_nodes_s(bare, 1e6, 16)


@pytest.mark.parametrize("cost", ["kernels", "gpu"])
def test_sixteen_ranks_of_experts_pay_for_the_hop(cost, tmp_path):
    data = json.loads((GPUS_DIR / "h100.json").read_text())
    data["network_bytes_s"] /= 10  # a tenth of the NIC
    slow = tmp_path / "h100.json"
    slow.write_text(json.dumps(data))

    def prefill_s(hardware: str) -> float:
        deployment = build_deployment(DeploymentOptions(
            model="Qwen/Qwen3-30B-A3B", hardware=hardware, tensor_parallel=4,
            data_parallel=4, expert_parallel=True, cost=cost))
        return deployment.cost_model.predict(BatchPlan(
            prefill_tokens=4096, prefill_attn=4096 * 4096,
            prefill_attn_causal=4096 * 4097 // 2, prefill_seqs=1, prefill_chunk_max=4096,
            prefill_context_max=4096, num_sampled=1))

    assert prefill_s("h100") < prefill_s(str(slow))


def test_the_experts_exchange_is_the_tables_nccl_all_gather_and_reduce_scatter():
    """vLLM's default exchange between data-parallel ranks with expert parallelism: an NCCL
    all-gather of every rank's tokens in, a reduce-scatter out (not TP's all-reduce)."""
    def deployment(**parallel):
        return build_deployment(DeploymentOptions(
            model="Qwen/Qwen3-30B-A3B", hardware="rtx-pro-6000", expert_parallel=True,
            cost="kernels", **parallel)).cost_model

    dp_ep, tp_ep = deployment(data_parallel=2), deployment(tensor_parallel=2)
    exchange = dp_ep.tables.exchange(2)
    for n in (16, 2048):
        message = n * dp_ep.shapes.hidden_size * 2
        assert (dp_ep.mlp_s(n, group_tokens=n) - tp_ep.mlp_s(n)
                == pytest.approx(exchange(message) * 1e-3))
        assert exchange(message) > dp_ep.tables.all_reduce(2)(message)


def test_a_gpu_files_own_all_reduce_prices_the_experts_exchange(tmp_path):
    # As for TP's all-reduces: a GPU file that measured its link beats the tables.
    data = json.loads((GPUS_DIR / "rtx-pro-6000.json").read_text())
    data["allreduce"] = {"2": {"latency_s": 1e-3, "bus_bytes_s": 1e9}}  # a slow link
    data["sources"]["allreduce"] = "a test's link"
    slow = tmp_path / "rtx-pro-6000.json"
    slow.write_text(json.dumps(data))

    def deployment(hardware: str):
        return build_deployment(DeploymentOptions(
            model="Qwen/Qwen3-30B-A3B", hardware=hardware, data_parallel=2,
            expert_parallel=True, cost="kernels"))

    shipped, own = deployment("rtx-pro-6000"), deployment(str(slow))
    assert "experts' exchange over 2 GPUs from the GPU file" in own.cost_model.describe()
    plan = BatchPlan(decode_seqs=8, num_sampled=8, decode_context=8 * 512,
                     decode_context_max=512)
    # 48 layers, each an exchange of at least the file's 1 ms latency.
    assert own.cost_model.predict(plan) > shipped.cost_model.predict(plan) + 40e-3
