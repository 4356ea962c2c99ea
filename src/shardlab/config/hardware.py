"""Hardware: accelerators (dense peak FLOP/s per dtype, memory, bandwidth, power) and links.

Peaks are the vendors' dense figures, never the 2:4-sparsity ones (a common error:
quoting 1979e12 for H100 BF16). Links are one-direction bandwidths in bytes/s.
Latencies (the alpha of the alpha-beta model) are not on spec sheets: the values
here are stated assumptions of the usual order of a small NCCL message, and a
user file can replace them.

A user TOML file adds entries, never replaces one: a name the catalog (or an alias, or an
earlier entry) already has is refused, as are unknown keys and dtypes (the file's form,
``[[accelerator]]`` and ``[[link]]`` tables, with an example: ``docs/guide/hardware.md``;
the reader: :func:`load_hardware_file`).

fp8 peaks are the datasheets' dense Tensor Core figures, half the "with sparsity" ones:
H100 SXM 3,958 -> 1,979 TFLOP/s (2x its bf16 989), H100 PCIe 3,026 -> 1,513, H200 SXM
as H100 SXM, MI300X 5,229.8 -> 2,614.9. The A100 has no fp8 (Ampere tensor cores: fp16,
bf16, tf32, int8), so ``--dtype fp8`` on it is refused (:func:`matmul_peaks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shardlab.config.lookup import find
from shardlab.config.runtime import Runtime
from shardlab.errors import (
    SpecError,
    require_number_in,
    require_positive_int,
    require_positive_number,
)

OPS_PER_LAYER_FORWARD = 12
"""Operators one layer's forward launches, as the planner charges their fixed cost
(:class:`Efficiency` ``op_overhead`` each): 2 norms, QKV, rotary/positions, attention,
output projection, 2 residual adds, 2-3 MLP matmuls and the activation (order of)."""


@dataclass(frozen=True)
class Link:
    """A link between devices: one-direction bandwidth (bytes/s) and latency (s)."""

    name: str
    bandwidth: float
    latency: float
    source: str = field(default="", compare=False)


@dataclass(frozen=True)
class Efficiency:
    """What fraction of the dense peak a matmul reaches, and the costs a peak leaves out.

    The planner's step-time model (:mod:`shardlab.plan.efficiency`) times a matmul
    [M, K] x [K, N] at ``peak_fraction · I / (I + half_intensity)`` of the dense peak,
    where I = 1 / (1/M + 1/K + 1/N) is its arithmetic intensity in FLOPs per byte at
    2-byte elements (2MKN FLOPs over 2(MK + KN + MN) bytes): small or thin matmuls
    are memory-bound (roofline, Williams et al. 2009) and reach less of the peak.
    ``op_overhead`` is seconds of fixed cost per operator launch (kernel launch on a
    GPU, eager dispatch on a CPU); ``link_fraction`` the share of a link's bandwidth
    that collectives reach (NCCL's bus bandwidth over the link's). ``source`` names
    the calibration runs (``docs/validation.md``).
    """

    peak_fraction: float
    half_intensity: float
    op_overhead: float
    link_fraction: float
    source: str = field(default="", compare=False)
    fp8_peak_fraction: float = 0.0
    """``peak_fraction`` of the fp8 linear matmuls (and of an fp8 attention kernel's core,
    ``flash_kernel=fp8``, below its cap) against the fp8 peak; 0, as every catalog
    curve leaves it, is the bf16 one times :data:`FP8_PEAK_RATIO` (:meth:`fp8_curve`,
    :data:`FP8_SHARE_SOURCE`). ``--measured-step`` with ``--dtype fp8`` fits it on a run of
    the user's own."""
    flash_fractions: tuple[tuple[str, float], ...] = ()
    """The most of the dense peak each fused attention kernel reaches here, (kernel,
    fraction) pairs, as its authors measured it (``fp8``: of the fp8 peak); a kernel not
    listed is held only to the curve."""

    def fp8_curve(self) -> Efficiency:
        """The curve fp8 linear matmuls follow against the fp8 peak: ``fp8_peak_fraction``
        (unset: ``peak_fraction`` x :data:`FP8_PEAK_RATIO`) at ``half_intensity`` x
        :data:`FP8_HALF_RATIO` (:data:`FP8_SHARE_SOURCE`)."""
        return replace(self, peak_fraction=self.fp8_peak_fraction
                       or self.peak_fraction * FP8_PEAK_RATIO,
                       half_intensity=self.half_intensity * FP8_HALF_RATIO)


@dataclass(frozen=True)
class Accelerator:
    """One device: dense peak FLOP/s per dtype, memory (bytes), HBM bandwidth (bytes/s), power (W).

    ``intra_link`` joins devices within a node (NVLink, xGMI, PCIe), ``inter_link``
    is each device's share of the network between nodes.
    """

    name: str
    peak_flops: dict[str, float]
    memory_bytes: float
    memory_bandwidth: float
    power_watts: float
    intra_link: Link
    inter_link: Link
    gpus_per_node: int = 8
    source: str = field(default="", compare=False)
    efficiency: Efficiency | None = field(default=None, compare=False)
    single_thread: tuple[float, Efficiency] | None = field(default=None, compare=False)
    """A measured CPU only: (fp32 FLOP/s of one thread, that thread's efficiency curve),
    what each of several one-thread processes gets (:mod:`shardlab.calibrate.cpu`)."""
    layer_probe: dict[str, float] | None = field(default=None, compare=False)
    """A measured CPU only: one llama layer's forward + backward on one thread (``batch``,
    ``seq``, ``d_model``, ``heads``, ``d_ff`` and ``seconds``), from which the planner
    derives what its memory-bound operators cost (:func:`shardlab.plan.layer_time.
    probe_elementwise_bandwidth`)."""
    host_link: Link | None = field(default=None, compare=False)
    """The device's link to its host's memory, per direction (PCIe, NVLink-C2C): what
    activation offloading copies over (:mod:`shardlab.plan.offload`); None: not known."""
    runtime: Runtime | None = field(default=None, compare=False)
    """A measured CPU only: gloo's collective rates and the runtime's fixed costs per
    parallel style, measured with real ranks (:mod:`shardlab.calibrate.runtime`)."""
    emulated: tuple[str, ...] = field(default=(), compare=False)
    """A measured CPU only: the dtypes whose matmul has no vectorised kernel here (bf16 on a
    CPU without AVX-512 BF16 or AMX); their ``peak_flops`` is that slow path's real rate."""

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for matmuls in ``dtype`` (fp32 falls back to tf32 if listed)."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        raise SpecError("dtype", dtype, f"{self.name} lists peaks for "
                        f"{', '.join(sorted(self.peak_flops))}")


def matmul_peaks(acc: Accelerator, compute: str, linear: str) -> tuple[float, float]:
    """(dense peak of ``compute``, of ``linear``) in FLOP/s: the dtypes a policy's other
    matmuls and its linear layers run in (:class:`~shardlab.config.dtypes.DtypePolicy`).
    One-line SpecError naming the dtype and the accelerator when it lists no such peak
    (fp8 on an A100: Ampere's tensor cores have no fp8)."""
    if linear not in acc.peak_flops:
        hint = ("; fp8 needs an fp8 tensor core (H100, H200, B200, GB200, MI300X)"
                if linear == "fp8" else "")
        raise SpecError("dtype", linear, f"{acc.name} has no {linear} matmul (it lists "
                        f"{', '.join(sorted(acc.peak_flops))}){hint}")
    return acc.peak(compute), acc.peak(linear)


POWER_EXPONENT = 3.0
"""Matmul throughput under a power cap P below the board power P0 is taken as
(P/P0)^(1/3) of its uncapped figure. A stated assumption, not a fit: a GPU running
tensor-core matmuls at its board power is power-limited, and the firmware holds a cap by
lowering the clock (``nvidia-smi -pl``); dynamic power goes as C·V²·f with the voltage
following the clock along the DVFS curve, so P ∝ f³ and f ∝ P^(1/3), and a compute-bound
matmul's rate goes with f. Memory bandwidth and links are left as they are (HBM and NVLink
keep their own clocks). torchtitan's H100s ran at 500 W of 700 W (0.894x)."""


def power_capped(acc: Accelerator, watts: float) -> Accelerator:
    """``acc`` under a power cap of ``watts``: every matmul peak times
    (min(watts, power)/power)^(1/3) (:data:`POWER_EXPONENT`), power_watts the cap."""
    cap = require_positive_number("power_cap_w", watts)
    if cap > acc.power_watts:  # a cap above the board power caps nothing
        raise SpecError("power_cap_w", watts, f"must be at most {acc.name}'s board power "
                        f"({acc.power_watts:g} W)")
    scale = (cap / acc.power_watts) ** (1 / POWER_EXPONENT)
    return replace(acc, peak_flops={k: v * scale for k, v in acc.peak_flops.items()},
                   power_watts=cap,
                   source=f"{acc.source}; capped at {cap:g} W: matmul peaks x {scale:.3f}")


def with_nics(acc: Accelerator, nics_per_node: int | None = None,
              nic_gbps: float | None = None) -> Accelerator:
    """``acc`` with its nodes' network stated: ``nics_per_node`` NICs of ``nic_gbps`` Gb/s
    each, shared by the node's devices, so each device's inter-node link carries
    nics·gbps/8/gpus_per_node bytes/s (a rail-optimised fabric: every NIC busy at once in
    a collective over many nodes). Left out, a count defaults to one NIC per device and a
    speed to the catalog link's per-device rate. The latency stays the link's."""
    node = acc.gpus_per_node
    nics = node if nics_per_node is None else require_positive_int("nics_per_node",
                                                                   nics_per_node)
    gbps = (acc.inter_link.bandwidth * 8 / 1e9 if nic_gbps is None
            else require_number_in("nic_gbps", nic_gbps, 1e-3, 1e7, "Gb/s"))
    link = Link(f"{nics} x {gbps:g} Gb/s per node", nics * gbps * 1e9 / 8 / node,
                acc.inter_link.latency, f"stated: {nics} NICs of {gbps:g} Gb/s per node of "
                f"{node} devices; latency of {acc.inter_link.name}")
    return replace(acc, inter_link=link)


_LAT = "latency assumed (order of a small NCCL message), not a spec figure"
LINKS: dict[str, Link] = {k.name: k for k in (
    Link("PCIe 4.0 x16", 32e9, 10e-6, "PCI-SIG: 16 GT/s x 16 lanes, 128b/130b; " + _LAT),
    Link("PCIe 5.0 x16", 64e9, 10e-6, "PCI-SIG: 32 GT/s x 16 lanes, 128b/130b; " + _LAT),
    Link("NVLink 3", 300e9, 5e-6, "NVIDIA A100 datasheet: 600 GB/s both directions; " + _LAT),
    Link("NVLink 4", 450e9, 5e-6, "NVIDIA H100 datasheet: 900 GB/s both directions; " + _LAT),
    Link("NVLink 5", 900e9, 5e-6, "NVIDIA Blackwell (HGX B200, GB200 NVL72): 1.8 TB/s per GPU "
         "both directions; " + _LAT),
    Link("Infinity Fabric", 448e9, 5e-6,
         "AMD MI300X datasheet: 7 links x 64 GB/s per direction; " + _LAT),
    Link("NVLink-C2C (GB200)", 225e9, 5e-6, "Grace to Blackwell: 'two B200 Tensor Core GPUs "
         "to a Grace CPU over a 900GB/s NVLink chip-to-chip interconnect' (NVIDIA, March "
         "2024), both directions for two GPUs: 225 GB/s per GPU each way (nvbandwidth on "
         "Azure ND GB200 v6 measured 201 host-to-device, 193 device-to-host); " + _LAT),
    Link("IB HDR 200G", 25e9, 10e-6, "NVIDIA ConnectX-6: 200 Gb/s per NIC; " + _LAT),
    Link("IB NDR 400G", 50e9, 10e-6, "NVIDIA ConnectX-7: 400 Gb/s per NIC; " + _LAT),
    Link("100 GbE", 12.5e9, 20e-6, "100 Gbit/s / 8; " + _LAT),
)}


def _gpu(name: str, flops: dict[str, float], mem: float, bw: float, watts: float,
         intra: str, inter: str, source: str, eff: Efficiency | None = None,
         per_node: int = 8, host: str | None = None) -> Accelerator:
    return Accelerator(name, flops, mem, bw, watts, LINKS[intra], LINKS[inter], per_node,
                       source, eff, host_link=LINKS[host] if host else None)


# Host links: "PCIe Gen5: 128GB/s" (H100, H200 and HGX B200 tables) and "PCIe Gen4: 64GB/s"
# (A100) count both directions: "128 GB/sec total bandwidth (64 GB/sec in each direction)"
# (NVIDIA, "NVIDIA Hopper Architecture In-Depth", 2022). GB200's is its NVLink-C2C share.


# Blackwell: NVIDIA's tables give tensor-core figures "with sparsity" (HGX B200: "FP8/FP6
# Tensor Core* 72 PFLOPS" for 8 GPUs, "* With sparsity"; GB200 NVL72 "720 PFLOPS" for 72 =
# 10 per GPU); the dense figures here are half. fp32 is the non-tensor rate. Their curve is
# calibrated on NVIDIA's dgxc bf16 run (BLACKWELL_EFFICIENCY below).
_BLACKWELL = ("NVIDIA Blackwell tables (HGX B200 and GB200 NVL72 columns), dense = half the "
              "'with sparsity' tensor figures; DGX B200 user guide: 1,440 GB for 8 GPUs, 8 "
              "ConnectX-7 400 Gb/s; DGX GB200 user guide: 4 GPUs and 4 ConnectX-7 400G per "
              "tray, 72 GPUs in one NVLink domain")


# Efficiency curves fitted by shardlab.plan.published.fit on the calibration runs of
# docs/validation.md (held-out runs are not used); tests/plan/test_published.py refits them.
# Fused attention kernels: FlashAttention-2 "up to 73% of the theoretical maximum FLOPs/s
# on A100" (Dao 2023, arXiv 2307.08691); on H100 "FlashAttention-2 achieves only 35%
# utilization", FlashAttention-3 "up to 740 TFLOPS, i.e. 75%" (Shah et al. 2024, arXiv
# 2407.08608; cuDNN's fused attention, which Transformer Engine calls, is of that class).
# FlashAttention-3 needs Hopper: on an A100 every kernel is held to FA2's figure.
# ``triton``: llm-foundry's ``attn_impl: triton`` (Tri Dao's Triton kernel of Nov 2022, "slightly
# slower than" FlashAttention-1 forward + backward by its docstring): FA2's share over FA2's
# "1.7-3.0x faster than FlashAttention" (Dao 2023, Sec. 4) at its geometric middle, 2.26 (32% of
# an A100, inside that paper's "25-40%" for FlashAttention-1), the ratio carried to the H100.
# ``fa1``: FlashAttention-1 itself (flash-attn 0.x), at the same share: the kernel that ratio is
# stated against. ``fp8``: a fused attention in fp8 (Transformer Engine's
# --fp8-dot-product-attention, which runs cuDNN's kernel), its share of the *fp8* peak taken
# from FlashAttention-3's fp8 path as a proxy: "with FP8 reaching close to 1.2 PFLOPs/s" on
# an H100 (Shah et al. 2024, abstract; its best case, forward), 1.2 of 1.979 PFLOP/s, the
# backward held to the same share; the A100 has no fp8.
_FA2_OVER_FA1 = (1.7 * 3.0) ** 0.5
_FA3_FP8_SHARE = 1.2e15 / 1979e12


def _flash(fa2: float, fa3: float, fp8: float | None = None) -> tuple[tuple[str, float], ...]:
    """The kernels' shares from FA2's and FA3's: Triton's and FA1's at FA2's over 2.26; an
    fp8 kernel's of the fp8 peak where the accelerator has one."""
    fa1 = fa2 / _FA2_OVER_FA1
    shares = (("fa2", fa2), ("fa3", fa3), ("triton", fa1), ("fa1", fa1))
    return shares if fp8 is None else (*shares, ("fp8", fp8))


_AMPERE_FLASH = _flash(0.73, 0.73)
_HOPPER_FLASH = _flash(0.35, 0.75, _FA3_FP8_SHARE)
FA2_BLACKWELL_SHARE = 361.6e12 / 2250e12
"""FlashAttention-2 on Blackwell, of the dense bf16 peak: flash-attn 2.x runs Ampere's
warp-level mma there, not Blackwell's tensor-memory MMA. Measured on a B200: forward, head
dim 128, 8 x 16 heads at 8,192 tokens, 361.6 TFLOP/s (meta-pytorch/tritonbench PR #171,
"flash_attn_v3 does not support B200, but flash_attn_v2 support is done on B200"; 352-362
from 2K to 8K tokens), a forward figure as the H100's 35% (Shah et al. 2024) is;
flash-attn 2.7.4.post1's own benchmark on a B200 gives 333-346 TFLOP/s forward + backward
at head dim 64, 8K-16K tokens (Dao-AILab/flash-attention issue #1589, "benchmark is low on
B200"). Against B200's 2,250 TFLOP/s: 16%, the share carried to the GB200. cuDNN's fused
kernel (Transformer Engine's default) keeps no cap on Blackwell."""
_BLACKWELL_FLASH = (("fa2", FA2_BLACKWELL_SHARE),)
FP8_PEAK_RATIO = 0.908 / 0.846
"""fp8 matmuls' asymptotic share of the fp8 peak over fp16's of the fp16 peak: the curve
``P · I/(I + h)`` fitted (least squares) to TileLang's H800 SXM benchmarks at M = N = 8192,
K = 256-16384 (:data:`FP8_SHARE_SOURCE`): fp16 P 0.846, h 276 (rms 0.005 of the peak); fp8 P
0.908, h 494 (rms 0.009)."""
FP8_HALF_RATIO = 494.0 / 276.0
"""fp8 matmuls' half-saturation intensity over fp16's, from the same fits: an fp8 matmul
needs about 1.8x the intensity to reach the same share of its doubled peak."""
FP8_SHARE_SOURCE = (
    "fp8 linear matmuls follow the bf16 curve against their own (doubled) dense peak, "
    "reshaped as measured fp8 matmuls are (FP8_PEAK_RATIO, FP8_HALF_RATIO, fitted on "
    "TileLang's H800 benchmarks below: a larger matmul to saturate, about the same share "
    "once saturated, as the largest matmuls also reach in OpenXLA's measured matmul table "
    "(xla/service/gpu/model/"
    "matmul_interpolator_data.h at 71feeddf, 'Update LHS cost models for B200/H100 FP8 "
    "matmul'): B200's largest, 4 x 4096^3, at 1670.5 TFLOP/s in bf16 and 3279.7 in fp8 e4m3, "
    "74% and 73% of the 2250 and 4500 TFLOP/s datasheet peaks (at the table's other large "
    "shapes fp8 gains a median 1.58x, not 2x: smaller matmuls saturate the fp8 peak less); "
    "its H100 fp8 column exceeds the H100's fp8 peak and is not used. On Hopper, TileLang's "
    "matmul benchmarks on an H800 SXM (the H100's 989 and 1979 TFLOP/s dense peaks; "
    "xwhzz/tilelang benchmark/matmul and matmul_fp8 READMEs at b2acfc37): M = N = 8192, "
    "K = 8192 at 758 TFLOP/s in fp16 and 1507 in fp8 (76.6% and 76.1%), K = 16384 at 766 "
    "and 1541, but K = 1024 at 628 and 1129 (63.5% and 57.0%). Large matmuls only, and "
    "TileLang's kernels, not cuBLAS's. Its first form, fp8 at the bf16 share, was adopted "
    "after its effect on the held-out runs had been seen (docs/validation.md, ninth "
    "revision); no fp8 share is fitted on a training run, and the fp8 runs that calibrated "
    "one are held out")
"""Why the catalog's curves leave ``fp8_peak_fraction`` unset (:meth:`Efficiency.fp8_curve`)."""
A100_EFFICIENCY = Efficiency(
    0.847, 248.0, 5e-6, 0.8,
    "fitted on Narayanan et al. 2021 Table 1 (1.7B, 7.5B, 39.1B, 145.6B, 529.6B rows) and "
    "Korthikanti et al. 2022 Table 5 (22B and 530B, selective recompute + sequence "
    "parallelism), A100 80GB; memory-bound operators timed apart at the memory bandwidth",
    flash_fractions=_AMPERE_FLASH)
H100_EFFICIENCY = Efficiency(
    0.650, 248.0, 5e-6, 0.8,
    "peak_fraction fitted on one bf16 calibration run per software stack: Llama 3 (Dubey et "
    "al. 2024) Table 4 8,192 GPUs, Megatron-Core 16B, torchtitan 8B FSDP8, MosaicML MPT-7B "
    "on 128 GPUs; fp8 linear matmuls on the same curve reshaped as measured fp8 matmuls are "
    "(FP8_SHARE_SOURCE); "
    "half_intensity, op_overhead and link_fraction taken from the A100 fit",
    flash_fractions=_HOPPER_FLASH)
BLACKWELL_EFFICIENCY = Efficiency(
    0.546, H100_EFFICIENCY.half_intensity,
    H100_EFFICIENCY.op_overhead, H100_EFFICIENCY.link_fraction,
    "peak_fraction fitted on one bf16 calibration run, NVIDIA dgxc-benchmarking's Llama 3.1 "
    "405B bf16 on 256 GB200 (TP 4, PP 8, CP 2, VP 8; plan/runs_dgxc.py); fp8 linear "
    "matmuls on the same curve reshaped as measured fp8 matmuls are (FP8_SHARE_SOURCE); "
    "half_intensity, op_overhead and "
    "link_fraction are the H100 curve's; no cap on cuDNN's attention kernel, "
    "FlashAttention-2 held to its B200 benchmarks (FA2_BLACKWELL_SHARE)",
    flash_fractions=_BLACKWELL_FLASH)


ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (
    _gpu("H100 SXM", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "tf32": 494.5e12,
                      "fp32": 67e12},
         80e9, 3.35e12, 700, "NVLink 4", "IB NDR 400G",
         "NVIDIA H100 Tensor Core GPU datasheet (SXM5), dense figures", H100_EFFICIENCY,
         host="PCIe 5.0 x16"),
    _gpu("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp8": 1513e12, "tf32": 378e12,
                       "fp32": 51e12},
         80e9, 2.0e12, 350, "PCIe 5.0 x16", "IB NDR 400G",
         "NVIDIA H100 Tensor Core GPU datasheet (PCIe), dense figures", H100_EFFICIENCY,
         host="PCIe 5.0 x16"),
    _gpu("H200 SXM", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "tf32": 494.5e12,
                      "fp32": 67e12},
         141e9, 4.8e12, 700, "NVLink 4", "IB NDR 400G",
         "NVIDIA H200 Tensor Core GPU datasheet (SXM), dense figures", H100_EFFICIENCY,
         host="PCIe 5.0 x16"),
    _gpu("A100 SXM 80GB", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
         80e9, 2.039e12, 400, "NVLink 3", "IB HDR 200G",
         "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB), dense figures", A100_EFFICIENCY,
         host="PCIe 4.0 x16"),
    _gpu("A100 SXM 40GB", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
         40e9, 1.555e12, 400, "NVLink 3", "IB HDR 200G",
         "NVIDIA A100 Tensor Core GPU datasheet (SXM 40GB), dense figures", A100_EFFICIENCY,
         host="PCIe 4.0 x16"),
    _gpu("B200", {"bf16": 2250e12, "fp16": 2250e12, "fp8": 4500e12, "tf32": 1100e12,
                  "fp32": 75e12},
         180e9, 7.7e12, 1000, "NVLink 5", "IB NDR 400G",
         "HGX B200 (8 per node, up to 1,000 W each): " + _BLACKWELL, BLACKWELL_EFFICIENCY,
         host="PCIe 5.0 x16"),
    _gpu("GB200", {"bf16": 2500e12, "fp16": 2500e12, "fp8": 5000e12, "tf32": 1250e12,
                   "fp32": 80e12},
         186e9, 8e12, 1200, "NVLink 5", "IB NDR 400G",
         "GB200 NVL72 (72 per NVLink domain, a node here; up to 1,200 W each): " + _BLACKWELL,
         BLACKWELL_EFFICIENCY, per_node=72, host="NVLink-C2C (GB200)"),
    _gpu("MI300X", {"bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12, "tf32": 653.7e12,
                    "fp32": 163.4e12},
         192e9, 5.3e12, 750, "Infinity Fabric", "IB NDR 400G",
         "AMD Instinct MI300X datasheet, dense matrix figures; host interface PCIe Gen 5 x16 "
         "(as spec tables quote it)", host="PCIe 5.0 x16"),
)}

ALIASES: dict[str, tuple[str, ...]] = {
    "H100 SXM": ("h100", "h100-sxm5", "h100-80gb", "nvidia h100"),
    "H200 SXM": ("h200", "nvidia h200"),
    "A100 SXM 80GB": ("a100", "a100-80gb", "nvidia a100"),
    "A100 SXM 40GB": ("a100-40gb",),
    "B200": ("nvidia b200", "hgx b200", "dgx b200"),
    "GB200": ("gb200 nvl72", "nvidia gb200"),
    "MI300X": ("amd mi300x", "mi300"),
}


PEAK_DTYPES: tuple[str, ...] = ("fp8", "bf16", "fp16", "tf32", "fp32", "fp64")
"""The dtypes an accelerator's ``peak_flops`` may list (those the catalog and the dtype
policies use)."""

MEASURED_NAMES: tuple[str, ...] = ("cpu", "cpu (measured)")
"""Names that always mean this machine's stored measurement (:mod:`shardlab.config.measured`
resolves them before any catalog or file), so no file entry may take them."""


def get_accelerator(name: str) -> Accelerator:
    """The catalog's accelerator ``name`` names (loosely: aliases, case and spacing; a
    user file's entries are :func:`shardlab.config.hardware_file.find_accelerator`'s)."""
    return find("gpu", name, ACCELERATORS, ALIASES)
