"""GPUs as data: every shipped file loads with a source per number; any file can be named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.specs.hardware import GPUS_DIR, HARDWARE_SPECS, gpu_hour_usd, hardware_spec, load_hardware

NUMBERS = ("peak_flops", "memory_bytes", "mem_bandwidth_bytes_s", "interconnect_bytes_s",
           "interconnect_latency_s", "host_link_bytes_s", "usd_per_hour")


def test_the_presets_the_issue_names_ship() -> None:
    assert {"a100-80gb", "h100", "h200", "b200", "l40s", "rtx-4090",
            "rtx-pro-6000"} <= set(HARDWARE_SPECS)


# The systems NVIDIA's AIConfigurator describes beside those: (bf16 dense TFLOP/s, fp8 dense
# TFLOP/s or None, memory MiB, memory TB/s, interconnect GB/s one way, max_gpus).
AICONFIGURATOR_SYSTEMS = {
    "b300": (2250, 4500, 275040, 7.75, 900, 8),
    "gb200": (2500, 5000, 189471, 8.0, 900, 72),  # the NVL72's NVLink domain
    "h100-pcie": (756.5, 1513, 80 * 1024, 2.0, 64, 8),  # PCIe Gen5: bridges pair only 2
    "a100-80gb-pcie": (312, None, 80 * 1024, 1.935, 32, 8),  # no FP8 tensor cores
    "l4": (121, 242.5, 23034, 0.3, 32, 8),  # 24 GB less ECC, as nvidia-smi reports it
}


@pytest.mark.parametrize("name", sorted(AICONFIGURATOR_SYSTEMS))
def test_aiconfigurator_systems_load_with_their_datasheet_figures(name: str) -> None:
    bf16, fp8, memory_mib, memory_tb_s, link_gb_s, max_gpus = AICONFIGURATOR_SYSTEMS[name]
    spec = load_hardware(GPUS_DIR / f"{name}.json")
    assert spec == HARDWARE_SPECS[name] == hardware_spec(name.upper())
    assert spec.peak_flops == bf16 * 1e12
    assert spec.peak_fp8_flops == (None if fp8 is None else fp8 * 1e12)
    assert spec.memory_bytes == memory_mib * 2**20
    assert spec.mem_bandwidth_bytes_s == memory_tb_s * 1e12
    assert spec.interconnect_bytes_s == link_gb_s * 1e9
    assert spec.max_gpus == max_gpus and spec.usd_per_hour > 0


@pytest.mark.parametrize("name", sorted(HARDWARE_SPECS))
def test_every_number_has_a_source(name: str) -> None:
    data = json.loads((GPUS_DIR / f"{name}.json").read_text())
    assert set(NUMBERS) <= set(data["sources"])
    assert data["peak_flops"]["bf16"] > 0 and HARDWARE_SPECS[name].usd_per_hour > 0


def test_fp8_flops_only_where_the_gpu_has_them() -> None:
    h100 = hardware_spec("h100")
    assert h100.flops_for("fp8") == pytest.approx(2 * h100.flops_for("bf16"), rel=0.01)
    with pytest.raises(ValueError, match="FP8"):
        hardware_spec("a100-80gb").flops_for("fp8")


def test_names_ignore_case_and_dashes() -> None:
    assert hardware_spec("RTX4090") is HARDWARE_SPECS["rtx-4090"]
    assert hardware_spec("RTXPRO6000") is HARDWARE_SPECS["rtx-pro-6000"]


def test_a_gpu_file_path_is_a_gpu(tmp_path: Path) -> None:
    data = json.loads((GPUS_DIR / "h100.json").read_text())
    path = tmp_path / "h20.json"
    path.write_text(json.dumps({**data, "name": "h20", "usd_per_hour": 1.5}))
    assert hardware_spec(str(path)).name == "h20"
    assert gpu_hour_usd(str(path)) == 1.5


@pytest.mark.parametrize(("change", "field"), [
    ({"memory_bytes": None}, "memory_bytes"), ({"peak_flops": {"fp16": 1e15}}, "peak_flops"),
    ({"mem_bandwidth_bytes_s": -1}, "mem_bandwidth_bytes_s"),
])
def test_a_bad_gpu_file_names_the_field(tmp_path: Path, change: dict, field: str) -> None:
    data = {**json.loads((GPUS_DIR / "h100.json").read_text()), **change}
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=field):
        load_hardware(path)


def test_a_gpu_file_may_carry_measured_all_reduces(tmp_path: Path) -> None:
    data = json.loads((GPUS_DIR / "rtx-pro-6000.json").read_text())
    path = tmp_path / "pro.json"
    path.write_text(json.dumps({**data, "allreduce": {
        "2": {"latency_s": 4e-5, "bus_bytes_s": 1.6e10},
        "4": {"latency_s": 6e-5, "bus_bytes_s": 1.2e10}}}))
    assert load_hardware(path).allreduce == ((2, 4e-5, 1.6e10), (4, 6e-5, 1.2e10))


@pytest.mark.parametrize("table", [{"2": {"latency_s": 1e-5}}, {"1": {"latency_s": 0,
                                   "bus_bytes_s": 1e10}}, {"two": {"latency_s": 0,
                                   "bus_bytes_s": 1e10}}, [1, 2]])
def test_a_bad_all_reduce_table_names_the_field(tmp_path: Path, table) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**json.loads((GPUS_DIR / "h100.json").read_text()),
                                "allreduce": table}))
    with pytest.raises(ValueError, match="allreduce"):
        load_hardware(path)


def test_a_network_figure_has_its_source_and_comes_with_its_latency(tmp_path: Path) -> None:
    for name, spec in HARDWARE_SPECS.items():
        data = json.loads((GPUS_DIR / f"{name}.json").read_text())
        if spec.network_bytes_s is not None:
            assert {"network_bytes_s", "network_latency_s"} <= set(data["sources"]), name
    assert hardware_spec("h100").network_bytes_s == 50e9  # a 400 Gb/s NIC per GPU
    data = json.loads((GPUS_DIR / "h100.json").read_text())
    del data["network_latency_s"]
    path = tmp_path / "half.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="network_bytes_s and network_latency_s go together"):
        load_hardware(path)
