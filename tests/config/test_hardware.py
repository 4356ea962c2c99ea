"""Hardware catalog: dense peaks from the spec sheets, loose names, user TOML files."""

import re
from pathlib import Path

import pytest

from shardlab.config.hardware import (
    ACCELERATORS,
    get_accelerator,
    matmul_peaks,
    power_capped,
    with_nics,
)
from shardlab.config.hardware_file import find_accelerator, load_hardware_file
from shardlab.errors import SpecError


def test_dense_bf16_peaks_not_sparse() -> None:
    # REFERENCE.md: vendor dense figures; H100's 1979e12 is the sparse one.
    assert ACCELERATORS["H100 SXM"].peak("bf16") == 989e12
    assert ACCELERATORS["H200 SXM"].peak("bf16") == 989e12
    assert ACCELERATORS["A100 SXM 80GB"].peak("bf16") == 312e12
    assert ACCELERATORS["MI300X"].peak("bf16") == 1307.4e12
    assert ACCELERATORS["H200 SXM"].memory_bandwidth == 4.8e12
    assert ACCELERATORS["MI300X"].memory_bytes == 192e9


def test_blackwell_peaks_are_half_the_sparse_tables() -> None:
    """NVIDIA's Blackwell tables quote tensor figures with sparsity: HGX B200 72 PFLOPS fp8
    for 8 GPUs, GB200 NVL72 720 PFLOPS for 72; dense is half. fp32 (75, 80 TFLOP/s) is the
    non-tensor rate; a GB200's NVLink domain is the whole rack of 72."""
    b200, gb200 = ACCELERATORS["B200"], ACCELERATORS["GB200"]
    assert b200.peak("fp8") == 72e15 / 8 / 2 and gb200.peak("fp8") == 720e15 / 72 / 2
    assert b200.peak("bf16") == b200.peak("fp8") / 2 and gb200.peak("bf16") == 2.5e15
    assert (b200.gpus_per_node, gb200.gpus_per_node) == (8, 72)
    assert b200.memory_bytes == 1440e9 / 8  # DGX B200: 1,440 GB for 8 GPUs
    assert b200.intra_link.bandwidth == gb200.intra_link.bandwidth == 1.8e12 / 2
    # One curve for both: peak_fraction fitted on one GB200 run (tests/plan/test_published.py
    # refits it), fp8 at the same share, the curve's shape Hopper's.
    assert b200.efficiency is gb200.efficiency is not None
    hopper = get_accelerator("h100").efficiency
    assert b200.efficiency.half_intensity == hopper.half_intensity
    assert b200.efficiency.op_overhead == hopper.op_overhead
    assert b200.efficiency.link_fraction == hopper.link_fraction


@pytest.mark.parametrize(("query", "name"), [
    ("b200", "B200"), ("GB200 NVL72", "GB200"),
    ("A100", "A100 SXM 80GB"), ("a100-80gb", "A100 SXM 80GB"), ("h100", "H100 SXM"),
    ("H200", "H200 SXM"), ("mi300x", "MI300X"), ("a100 sxm 40gb", "A100 SXM 40GB"),
])
def test_loose_names(query: str, name: str) -> None:
    assert get_accelerator(query).name == name


def test_unknown_dtype_and_name() -> None:
    with pytest.raises(SpecError, match="dtype"):
        ACCELERATORS["A100 SXM 80GB"].peak("fp8")
    with pytest.raises(SpecError, match="gpu"):
        get_accelerator("H900")


def test_user_file_adds_an_accelerator(tmp_path: Path) -> None:
    f = tmp_path / "hw.toml"
    f.write_text('''
[[link]]
name = "EFA"
bandwidth = 25e9
latency = 15e-6

[[accelerator]]
name = "Trainium2"
peak_flops = { bf16 = 667e12 }
memory_bytes = 96e9
memory_bandwidth = 2.9e12
power_watts = 500
gpus_per_node = 16
intra_link = "NVLink 4"
inter_link = "EFA"
host_link = "PCIe 5.0 x16"
''')
    acc = find_accelerator("trainium2", f)
    assert acc.peak("bf16") == 667e12 and acc.gpus_per_node == 16
    assert acc.inter_link.bandwidth == 25e9
    assert acc.host_link is not None and acc.host_link.bandwidth == 64e9
    accels, links = load_hardware_file(f)
    assert "H100 SXM" in accels and "EFA" in links


@pytest.mark.parametrize(("text", "field"), [
    ('[[accelerator]]\nname = "x"\n', "accelerator[0].peak_flops"),
    ('[[accelerator]]\nname="x"\npeak_flops={bf16=-1}\nmemory_bytes=1\nmemory_bandwidth=1\n'
     'power_watts=1\nintra_link="NVLink 4"\ninter_link="100 GbE"\n',
     "accelerator[0].peak_flops.bf16"),
    ('[[accelerator]]\nname="x"\npeak_flops={bf16=1e15}\nmemory_bytes=1e9\n'
     'memory_bandwidth=1e12\npower_watts=500\nintra_link="warp drive"\ninter_link="100 GbE"\n',
     "accelerator[0].intra_link"),
    ("this is = not toml [", "hardware_file"),
])
def test_bad_user_file_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "hw.toml"
    f.write_text(text)
    with pytest.raises(SpecError) as e:
        load_hardware_file(f)
    assert e.value.field == field


@pytest.mark.parametrize(("key", "value", "message"), [
    # 1e308 bytes overflowed the inference roofline, a 1e308 or 1e-300 FLOP/s peak gave a
    # division by zero or NaN steps: typos, refused with the range.
    ("memory_bytes", "1e308", "must be from 1e+06 to 1e+15 bytes"),
    ("peak_flops", "{ bf16 = 1e308 }", "must be from 1e+06 to 1e+18 FLOP/s"),
    ("peak_flops", "{ bf16 = 1e-300 }", "must be from 1e+06 to 1e+18 FLOP/s"),
    ("memory_bandwidth", "1e-3", "must be from 1000 to 1e+15 bytes/s"),
    ("power_watts", "1e9", "must be from 1 to 100000 W"),
    ("intra_link", "{ name = \"l\", bandwidth = 1e20, latency = 1e-6 }",
     "must be from 1000 to 1e+15 bytes/s"),
    ("intra_link", "{ name = \"l\", bandwidth = 1e11, latency = 100 }",
     "must be from 1e-09 to 10 s"),
])
def test_a_number_far_outside_its_range_is_refused(tmp_path: Path, key: str, value: str,
                                                   message: str) -> None:
    lines = [line if not line.startswith(key) else f"{key} = {value}"
             for line in GOOD_ACCELERATOR.format(name="Z").splitlines()]
    f = tmp_path / "hw.toml"
    f.write_text("[[accelerator]]\n" + "\n".join(lines) + "\n")
    with pytest.raises(SpecError, match=re.escape(message)):
        load_hardware_file(f)


def test_a_stated_nic_speed_has_its_range() -> None:
    with pytest.raises(SpecError, match=re.escape("nic_gbps=1e+308: must be from 0.001 to "
                                                  "1e+07 Gb/s")):
        with_nics(get_accelerator("h100"), 8, 1e308)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot be read"):
        load_hardware_file(tmp_path / "nope.toml")


GOOD_ACCELERATOR = ('name = "{name}"\npeak_flops = {{ bf16 = 1e15 }}\nmemory_bytes = 96e9\n'
                    'memory_bandwidth = 3e12\npower_watts = 600\nintra_link = "NVLink 4"\n'
                    'inter_link = "100 GbE"\n')


def _accelerator(name: str = "My GPU", extra: str = "") -> str:
    return "[[accelerator]]\n" + GOOD_ACCELERATOR.format(name=name) + extra


@pytest.mark.parametrize(("text", "field", "value", "needle"), [
    # A typo once left gpus_per_node at 8 unseen, and "bf17" was listed as a dtype.
    (_accelerator(extra="gpus_per_nod = 16\n"), "accelerator[0]", "gpus_per_nod",
     "unknown key; allowed: name, peak_flops"),
    (_accelerator().replace("bf16", "bf17"), "accelerator[0].peak_flops", "bf17",
     "unknown dtype; allowed: fp8, bf16, fp16, tf32, fp32, fp64"),
    (_accelerator(extra='inter_link = { name = "x", bandwidth = 1e9, latency = 1e-6, '
                  'sorce = "me" }\n').replace('inter_link = "100 GbE"\n', ""),
     "accelerator[0].inter_link", "sorce", "unknown key"),
    ('[[link]]\nname = "EFA"\nbandwidth = 25e9\nlatency = 15e-6\nlatncy = 1\n', "link[0]",
     "latncy", "unknown key"),
    (_accelerator() + "[[accelerators]]\n", "hardware_file", "accelerators",
     "[[link]] and [[accelerator]]"),
    # A same-named entry once replaced the catalog's silently.
    (_accelerator("H100 SXM"), "accelerator[0].name", "H100 SXM", "the catalog's accelerator"),
    (_accelerator("nvidia-h100"), "accelerator[0].name", "nvidia-h100", "alias"),
    (_accelerator("CPU"), "accelerator[0].name", "CPU", "this machine's measurement"),
    (_accelerator() + _accelerator("my gpu"), "accelerator[1].name", "my gpu",
     "accelerator[0]"),
    ('[[link]]\nname = "NVLink 4"\nbandwidth = 1e9\nlatency = 1e-6\n', "link[0].name",
     "NVLink 4", "the catalog's link"),
    (_accelerator(extra="gpus_per_node = 2000000\n"), "accelerator[0].gpus_per_node", 2_000_000,
     "must be <= 1,048,576"),
])
def test_a_file_only_adds_known_keys_and_new_names(tmp_path: Path, text: str, field: str,
                                                   value: object, needle: str) -> None:
    f = tmp_path / "hw.toml"
    f.write_text(text)
    with pytest.raises(SpecError) as e:
        load_hardware_file(f)
    assert (e.value.field, e.value.value) == (field, value)
    assert needle in str(e.value)


def test_a_file_entry_with_its_own_name_and_source(tmp_path: Path) -> None:
    f = tmp_path / "hw.toml"
    f.write_text(_accelerator("H100 SXM (our cluster)", 'source = "our bench"\n'))
    accels, _ = load_hardware_file(f)
    assert accels["H100 SXM"] == ACCELERATORS["H100 SXM"]
    assert accels["H100 SXM (our cluster)"].source == "our bench"
    assert find_accelerator("H100 SXM (our cluster)", f).peak("bf16") == 1e15


def test_a_device_is_not_read_as_a_hardware_file() -> None:
    with pytest.raises(SpecError, match=r"hardware_file='/dev/zero': must be a regular file"):
        load_hardware_file("/dev/zero")


def test_fp8_peaks_are_twice_bf16_where_the_datasheet_has_them() -> None:
    for name in ("H100 SXM", "H200 SXM", "H100 PCIe"):
        acc = get_accelerator(name)
        assert matmul_peaks(acc, "bf16", "fp8") == (acc.peak("bf16"),
                                                     pytest.approx(2 * acc.peak("bf16"), rel=1e-3))
    with pytest.raises(SpecError, match=r"A100 SXM 80GB has no fp8 matmul.*fp8 tensor core"):
        matmul_peaks(get_accelerator("a100"), "bf16", "fp8")
    # Another missing dtype is not told about fp8 (it once was).
    with pytest.raises(SpecError) as e:
        matmul_peaks(get_accelerator("h100"), "fp64", "fp64")
    assert "has no fp64 matmul" in str(e.value) and "fp8" not in str(e.value).split(")")[-1]


def test_a_power_cap_scales_matmul_peaks_by_the_cube_root() -> None:
    h100 = get_accelerator("h100")
    capped = power_capped(h100, 500)
    assert capped.peak("bf16") == pytest.approx(989e12 * (500 / 700) ** (1 / 3))
    assert capped.memory_bandwidth == h100.memory_bandwidth and capped.power_watts == 500
    with pytest.raises(SpecError, match=r"power_cap_w=900: must be at most H100 SXM's board "
                       r"power \(700 W\)"):
        power_capped(h100, 900)  # once a silent no-op
    assert power_capped(h100, 700).peak("bf16") == h100.peak("bf16")


def test_nics_per_node_share_the_node_s_network() -> None:
    h100 = get_accelerator("h100")
    assert with_nics(h100).inter_link.bandwidth == h100.inter_link.bandwidth  # 8 x 400 Gb/s
    four = with_nics(h100, 4, 100)
    assert four.inter_link.bandwidth == pytest.approx(4 * 100e9 / 8 / 8)
    assert four.inter_link.latency == h100.inter_link.latency


def test_a_user_file_states_its_nics(tmp_path: Path) -> None:
    f = tmp_path / "hw.toml"
    f.write_text(_accelerator("Our GPU", "nics_per_node = 4\nnic_gbps = 200\n"))
    acc = load_hardware_file(f)[0]["Our GPU"]
    assert acc.inter_link.bandwidth == pytest.approx(4 * 200e9 / 8 / acc.gpus_per_node)
