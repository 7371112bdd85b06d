"""The GPU catalog and the --gpus grammar."""

import pytest

from planner.catalog.gpus import catalog, normalize, parse_gpus
from planner.core.errors import PlannerInputError
from planner.core.units import GB, GIB

REQUIRED = [
    "V100-SXM-16", "V100-SXM-32", "T4-16", "A10G-24", "L4-24", "L40S-48", "RTX3090-24", "RTX4090-24",
    "RTXA6000-48", "A100-SXM-40", "A100-PCIE-40", "A100-SXM-80", "A100-PCIE-80", "H100-SXM-80",
    "H100-PCIE-80", "H100-NVL-94", "H200-141", "B200-180", "MI300X-192",
]
FIGURES = ("memory", "memory_bandwidth", "dense_tflops", "gpu_link", "host_link", "compute_capability")


def test_required_gpus_with_a_source_for_every_figure():
    assert set(REQUIRED) <= set(catalog())
    for gid, f in catalog().items():
        assert set(FIGURES) <= set(f.sources), gid
        assert all(f.sources[k].strip() for k in FIGURES), gid
        assert set(f.dense_tflops) == {"fp32", "tf32", "fp16", "bf16", "fp8"}, gid


def test_precision_support_follows_compute_capability():
    """bf16 tensor cores from Ampere (8.0), fp8 from Ada (8.9): NVIDIA CUDA programming guide."""
    for gid, f in catalog().items():
        if f.vendor != "nvidia":
            continue
        cc = tuple(int(x) for x in f.compute_capability.split("."))
        assert (f.dense_tflops["bf16"] is not None) == (cc >= (8, 0)), gid
        assert (f.dense_tflops["fp8"] is not None) == (cc >= (8, 9)), gid
        assert (f.dense_tflops["tf32"] is not None) == (cc >= (8, 0)), gid


def test_no_spelling_names_two_gpus():
    owner: dict[str, str] = {}
    for gid, f in catalog().items():
        for name in [gid, *f.aliases]:
            assert owner.setdefault(normalize(name), gid) == gid, (name, owner[normalize(name)], gid)


@pytest.mark.parametrize(
    "spec, gpu, nodes, per_node",
    [("1xA100-40", "A100-SXM-40", 1, 1), ("8xH100-80", "H100-SXM-80", 1, 8), ("4x8xH100-80", "H100-SXM-80", 4, 8),
     ("4X8Xh100-80", "H100-SXM-80", 4, 8), ("2xa100-40gb", "A100-SXM-40", 1, 2), ("H100-SXM", "H100-SXM-80", 1, 1),
     ("1xRTX4090-24", "RTX4090-24", 1, 1), ("8 x nvidia h200", "H200-141", 1, 8), ("2x4xMI300X", "MI300X-192", 2, 4)],
)
def test_grammar(spec, gpu, nodes, per_node):
    hw = parse_gpus(spec)
    assert (hw.gpu.id, hw.nodes, hw.gpus_per_node, hw.num_gpus) == (gpu, nodes, per_node, nodes * per_node)


def test_a100_40_memory_is_40_gib():
    assert parse_gpus("1xA100-40").gpu.memory_bytes == 40 * GIB


@pytest.mark.parametrize("spec, needle", [("", "Grammar"), ("2xA1000", "A100"), ("0xH100-80", "at least 1"),
                                          ("32xH100-80", "4x8x"), ("8xfoo.yaml", "not found")])
def test_bad_specs_are_clear_errors(spec, needle):
    with pytest.raises(PlannerInputError) as e:
        parse_gpus(spec)
    assert needle in e.value.message


def test_user_gpu_yaml(tmp_path):
    path = tmp_path / "mygpu.yaml"
    path.write_text(
        "id: MY-GPU\nname: My GPU\nvendor: nvidia\narchitecture: hopper\ncompute_capability: '9.0'\n"
        "memory_mib: 65536\nmemory_bandwidth_gb_per_s: 2000\ndense_tflops: {fp32: 50, bf16: 600, fp8: 1200}\n"
        "gpu_link: {kind: pcie5, gb_per_s: 64}\nhost_link: {kind: pcie5, gb_per_s: 64}\n"
    )
    hw = parse_gpus(f"2x{path}")
    assert hw.gpu.id == "MY-GPU" and hw.gpus_per_node == 2 and hw.gpu.memory_bytes == 64 * GIB
    assert hw.gpu.supports("fp8") and not hw.gpu.supports("tf32")
    path.write_text("id: X\nmemory_mib: -3\n")
    with pytest.raises(PlannerInputError) as e:
        parse_gpus(str(path))
    assert "memory_mib" in e.value.message and "name" in e.value.message  # every problem at once


def test_host_memory_default_and_flag():
    one = parse_gpus("1xA100-40")
    assert one.host_memory_bytes_per_node == 80 * GIB  # 2 x 40 GiB > 64 GB
    assert parse_gpus("1xT4").host_memory_bytes_per_node == 64 * GB
    assert parse_gpus("1xA100-40", host_memory_gb=512).host_memory_bytes_per_node == 512 * GB
    with pytest.raises(PlannerInputError):
        parse_gpus("1xA100-40", host_memory_gb=-1)


def test_example_custom_gpu_file_loads():
    from pathlib import Path

    hw = parse_gpus(f"4x{Path(__file__).parent.parent / 'examples' / 'custom-gpu.yaml'}")
    assert hw.gpu.id == "MY-LAB-GPU-64" and hw.num_gpus == 4 and hw.gpu.memory_bytes == 64 * GIB


@pytest.mark.parametrize("spec, taken, others", [("A100", "A100-SXM-80", ["A100-SXM-40", "A100-PCIE-40", "A100-PCIE-80"]),
                                                 ("8xH100", "H100-SXM-80", ["H100-PCIE-80", "H100-NVL-94"]),
                                                 ("nvidia v100", "V100-SXM-32", ["V100-SXM-16"])])
def test_a_name_several_gpus_share_is_taken_with_a_note(spec, taken, others):
    hw = parse_gpus(spec)
    assert hw.gpu.id == taken and len(hw.notes) == 1
    assert f"taken as {taken}" in hw.notes[0] and all(o in hw.notes[0] for o in others)


@pytest.mark.parametrize("spec", ["1xA100-40", "8xH100-80", "A100-80", "H100-SXM", "1xRTX4090-24", "L4", "2x4xMI300X"])
def test_specific_names_have_no_note(spec):
    assert parse_gpus(spec).notes == []


def test_more_gpus_in_a_node_than_usual_is_a_note_not_a_refusal():
    hw = parse_gpus("8xRTX4090-24")
    assert (hw.nodes, hw.gpus_per_node) == (1, 8)
    assert len(hw.notes) == 1 and "above the usual 4" in hw.notes[0] and "2x4xRTX4090-24" in hw.notes[0]
    assert "2x8x" in parse_gpus("16xH100-80").notes[0]


def test_the_notes_reach_the_results():
    from planner.engine.estimate import estimate
    from planner.schema.estimate import EstimateRequest

    r = estimate(EstimateRequest(model="meta-llama/Llama-3.2-1B", gpus="A100"))
    assert any("taken as A100-SXM-80" in w for w in r.warnings)
    assert not any("taken as" in w for w in estimate(EstimateRequest(model="meta-llama/Llama-3.2-1B", gpus="A100-40")).warnings)
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    assert any("taken as A100-SXM-80" in w for w in suggest(SuggestRequest(model="meta-llama/Llama-3.2-1B", gpus="A100",
                                                                         top=1)).reasons)


def test_cuda_context_from_a_gpus_sms_threads_and_driver_reserve(tmp_path):
    """A GPU file with its SM count and driver reservation sizes its CUDA context as the driver's
    reservation + 1 KiB x resident threads per SM x SMs + the measured rest; without either it
    takes the flat assumption. Every catalog entry that gives them names a source for each."""
    from planner.core.units import MIB
    from planner.cost import overheads

    base = ("id: MY-GPU\nname: My GPU\nvendor: nvidia\narchitecture: ampere\ncompute_capability: '8.6'\n"
            "memory_mib: 24576\nmemory_bandwidth_gb_per_s: 900\ndense_tflops: {fp32: 35, bf16: 140}\n"
            "gpu_link: {kind: pcie4, gb_per_s: 32}\nhost_link: {kind: pcie4, gb_per_s: 32}\n")
    path = tmp_path / "mygpu.yaml"
    path.write_text(base + "sm_count: 82\ndriver_reserved_mib: 333\n")
    sized = overheads.cuda_context_bytes(parse_gpus(str(path)).gpu)
    assert sized == 333 * MIB + 1024 * 1536 * 82 + overheads.PROCESS_CONTEXT_BYTES
    path.write_text(base + "sm_count: 82\n")
    assert overheads.cuda_context_bytes(parse_gpus(str(path)).gpu) == overheads.CUDA_CONTEXT_BYTES
    path.write_text(base + "sm_count: 0\n")
    with pytest.raises(PlannerInputError):
        parse_gpus(str(path))
    for gid, f in catalog().items():
        for field in ("sm_count", "driver_reserved_mib"):
            if getattr(f, field) is not None:
                assert f.sources.get(field, "").strip(), (gid, field)


@pytest.mark.parametrize("gpus, shm", [("2xRTX4090-24", True), ("2x1xRTX4090-24", False), ("2xA100-80", False),
                                       ("2xRTX3090-24", True), ("2xA40-48", False)])
def test_nccl_keeps_its_buffers_on_the_host_where_gpus_lack_peer_access(gpus, shm):
    """GeForce cards (RTX 30 and 40) cannot map each other's memory over PCIe (accelerate disables
    NCCL's P2P on the RTX 40; NCCL finds none on the RTX 30), so inside a node NCCL's SHM transport keeps every channel FIFO in host shared memory:
    the GPU's NCCL row is the communicator's small figure, not the peer-to-peer buffers; across
    nodes the network buffers are in device memory again."""
    from planner.cost import overheads
    from planner.engine.estimate import estimate
    from planner.schema.estimate import EstimateRequest

    r = estimate(EstimateRequest(model="meta-llama/Llama-3.2-1B", gpus=gpus))
    [row] = [x for x in r.ledger if x.label == "NCCL buffers and communicators"]
    assert row.bytes == (overheads.NCCL_SHM_BYTES if shm else overheads.NCCL_BYTES)
    assert ("SHM transport" in row.note) is shm
    assert catalog()["RTX4090-24"].peer_access is False and catalog()["A100-SXM-80"].peer_access is True
    assert catalog()["RTX3090-24"].peer_access is False
