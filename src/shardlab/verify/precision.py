"""How FP32, FP16 and BF16 represent sample numbers, and what CPU autocast does to dtypes.

The formats (IEEE 754 binary32 and binary16; bfloat16 is binary32 with the low 16 bits
of the fraction dropped). ``p`` is the precision in bits, the implicit leading 1
included; rounding is to nearest, ties to even, so a value in the normal range is
stored with relative error at most the unit roundoff ``u = 2^-p``:

====  ========  ========  ==  =========  =====================  ==========  ==========
name  exponent  fraction  p   u          largest finite         min normal  min subnorm
====  ========  ========  ==  =========  =====================  ==========  ==========
fp32  8         23        24  2^-24      (2 - 2^-23) 2^127      2^-126      2^-149
fp16  5         10        11  2^-11      (2 - 2^-10) 2^15       2^-14       2^-24
bf16  8         7         8   2^-8       (2 - 2^-7) 2^127       2^-126      2^-133
====  ========  ========  ==  =========  =====================  ==========  ==========

so fp16's largest finite number is 65504, and bf16 has fp32's range with far less
precision. Facts checked on the sample values:

* fp16 keeps 60000 exactly (the spacing in [2^15, 2^16) is 32 and 60000 = 1875 x 32):
  60000 is finite in fp16; the range ends at 65504;
* fp16 rounds 65520 to inf: 65520 lies exactly halfway between 65504 (significand all
  ones, odd) and 2^16; ties go to the even neighbour, 2^16, which exceeds the format, so
  the result overflows to inf (anything >= 65520 does; 1e5 + 0.5 too). bf16 rounds 65520
  to 65536, finite;
* fp16 underflows 1e-8 to 0: it is below fp16's normal range (2^-14 ~ 6.1e-5) and even
  below half the smallest subnormal (2^-25 ~ 2.98e-8), so it rounds to zero. bf16 keeps
  it as a normal number (>= 2^-126), relative error <= 2^-8;
* relative error <= 2^-8 for bf16 on every sample (all lie in its normal range), <= 2^-11
  for fp16 on the samples in its normal range and <= 65504, <= 2^-24 for fp32.

Then CPU autocast: under ``torch.autocast("cpu", dtype=torch.bfloat16)`` an
``nn.Linear`` computes in bf16 (its output dtype is bfloat16) while its weight stays
float32, and after backward the weight's gradient is float32 (autocast casts a bf16 copy
for the matmul; the cast's backward returns the gradient in the parameter's dtype).
Checks with a boolean outcome have value 0 (as expected) or 1. Rank-local; writes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from shardlab.distributed.launch import RankContext
from shardlab.verify.registry import check

SAMPLES: tuple[tuple[str, float], ...] = (
    ("0.1", 0.1), ("1/3", 1 / 3), ("3.14159265", 3.14159265), ("60000", 60000.0),
    ("65504", 65504.0), ("65520", 65520.0), ("1e5+0.5", 1e5 + 0.5), ("1e-8", 1e-8),
)


@dataclass(frozen=True)
class Format:
    """A binary floating-point format, by its defining numbers."""

    name: str
    dtype: torch.dtype
    precision: int  # significand bits, the implicit 1 included
    max_finite: float
    min_normal: float
    min_subnormal: float

    @property
    def unit_roundoff(self) -> float:
        """2^-p: the bound on relative error in the normal range (round to nearest)."""
        return 2.0 ** -self.precision


FORMATS: tuple[Format, ...] = (
    Format("fp32", torch.float32, 24, (2 - 2**-23) * 2.0**127, 2.0**-126, 2.0**-149),
    Format("fp16", torch.float16, 11, (2 - 2**-10) * 2.0**15, 2.0**-14, 2.0**-24),
    Format("bf16", torch.bfloat16, 8, (2 - 2**-7) * 2.0**127, 2.0**-126, 2.0**-133),
)
FMT = {f.name: f for f in FORMATS}


@dataclass(frozen=True)
class Representation:
    """``value`` stored in format ``fmt``: the stored number and its errors vs float64."""

    label: str
    value: float
    fmt: str
    stored: float
    abs_error: float
    rel_error: float
    kind: str  # "normal", "subnormal", "zero (underflow)", "inf (overflow)"


def represent(label: str, value: float, fmt: Format) -> Representation:
    """Round the float64 ``value`` into ``fmt`` (torch's conversion) and read it back."""
    stored = torch.tensor(value, dtype=torch.float64).to(fmt.dtype).double().item()
    if math.isinf(stored):
        kind, err = "inf (overflow)", math.inf
    else:
        err = abs(stored - value)
        kind = ("zero (underflow)" if stored == 0 and value != 0 else
                "subnormal" if abs(stored) < fmt.min_normal else "normal")
    return Representation(label, value, fmt.name, stored, err,
                          err / abs(value) if value else err, kind)


def table() -> list[Representation]:
    """Every sample in every format, samples in order, formats fp32, fp16, bf16."""
    return [represent(label, v, f) for label, v in SAMPLES for f in FORMATS]


def _in_normal_range(value: float, fmt: Format) -> bool:
    return fmt.min_normal <= abs(value) <= fmt.max_finite


def autocast_dtypes() -> tuple[torch.dtype, torch.dtype, torch.dtype | None, bool]:
    """(output dtype, weight dtype, weight-grad dtype, grads finite) of a Linear under CPU
    bf16 autocast. Weights come from a private generator; the global RNG is untouched."""
    gen = torch.Generator().manual_seed(2028)
    layer = torch.nn.utils.skip_init(nn.Linear, 8, 4)  # no init, so no global RNG use
    with torch.no_grad():
        layer.weight.copy_(torch.randn(4, 8, generator=gen))
        layer.bias.copy_(torch.randn(4, generator=gen))
    x = torch.randn(2, 8, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    out.float().square().mean().backward()
    grad = layer.weight.grad
    finite = grad is not None and bool(torch.isfinite(grad).all())
    return out.dtype, layer.weight.dtype, None if grad is None else grad.dtype, finite


def _line(rows: list[Representation]) -> str:
    return "; ".join(f"{r.fmt} {r.stored:.9g} ({r.kind}, abs err {r.abs_error:.3g})"
                     for r in rows)


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """The representation facts and the autocast dtypes (no collective)."""
    rows = table()
    by = {(r.label, r.fmt): r for r in rows}

    def worst(fmt: str) -> tuple[float, list[str]]:
        labels = [lab for lab, v in SAMPLES if _in_normal_range(v, FMT[fmt])]
        return max(by[lab, fmt].rel_error for lab in labels), labels

    def flag(ok: bool) -> float:
        return 0.0 if ok else 1.0

    fp16_65520, bf16_65520 = by["65520", "fp16"], by["65520", "bf16"]
    fp16_tiny, bf16_tiny = by["1e-8", "fp16"], by["1e-8", "bf16"]
    fp16_60000 = by["60000", "fp16"]
    bf16_tiny_ok = (bf16_tiny.stored != 0 and bf16_tiny.kind == "normal"
                    and bf16_tiny.rel_error <= FMT["bf16"].unit_roundoff)
    checks = [
        check("fp16_65520_overflows", flag(math.isinf(fp16_65520.stored)), 0,
              passed=math.isinf(fp16_65520.stored) and by["65504", "fp16"].stored == 65504.0,
              detail=f"65520 is halfway between fp16's max 65504 and 2^16; ties-to-even picks "
                     f"2^16, beyond the format: inf. 65520 -> {_line([fp16_65520, bf16_65520])}; "
                     f"1e5+0.5 -> {_line([by['1e5+0.5', 'fp16']])}"),
        check("fp16_60000_finite", flag(fp16_60000.stored == 60000.0), 0,
              passed=fp16_60000.stored == 60000.0,
              detail=f"60000 = 1875 x 32 is exact in fp16 (max finite 65504): "
                     f"{_line([fp16_60000])}"),
        check("fp16_1e-8_underflows", flag(fp16_tiny.stored == 0.0), 0,
              passed=fp16_tiny.stored == 0.0,
              detail=f"1e-8 < 2^-25 (half of fp16's smallest subnormal 2^-24 ~ 5.96e-8) rounds "
                     f"to 0; fp16's normal range starts at 2^-14: {_line([fp16_tiny])}"),
        check("bf16_1e-8_normal", flag(bf16_tiny_ok), 0, passed=bf16_tiny_ok,
              detail=f"bf16's normal range starts at 2^-126 (as fp32's): {_line([bf16_tiny])}, "
                     f"relative error {bf16_tiny.rel_error:.3g} <= 2^-8"),
    ]
    for fmt in ("bf16", "fp16", "fp32"):
        err, labels = worst(fmt)
        u = FMT[fmt].unit_roundoff
        checks.append(check(
            f"{fmt}_relative_error_bound", err, u,
            detail=f"max relative error {err:.3g} <= 2^-{FMT[fmt].precision} = {u:.3g} over the "
                   f"samples in {fmt}'s normal range: {', '.join(labels)}"))
    finfo_ok = all(torch.finfo(f.dtype).max == f.max_finite
                   and torch.finfo(f.dtype).tiny == f.min_normal
                   and torch.finfo(f.dtype).eps == 2.0 ** (1 - f.precision)
                   and torch.finfo(f.dtype).smallest_normal * torch.finfo(f.dtype).eps
                   == f.min_subnormal for f in FORMATS)
    checks.append(check("format_constants_match_finfo", flag(finfo_ok), 0, passed=finfo_ok,
                        detail="largest finite, min normal, eps = 2^(1-p) and min subnormal "
                               "= min normal x eps, as stated, agree with torch.finfo"))
    out, weight, grad, finite = autocast_dtypes()
    under = "under torch.autocast('cpu', dtype=torch.bfloat16)"
    checks += [
        check("autocast_output_bf16", flag(out == torch.bfloat16), 0,
              passed=out == torch.bfloat16, detail=f"{under}: Linear output dtype {out}"),
        check("autocast_weight_stays_fp32", flag(weight == torch.float32), 0,
              passed=weight == torch.float32, detail=f"{under}: Linear weight dtype {weight}"),
        check("autocast_weight_grad_fp32", flag(grad == torch.float32 and finite), 0,
              passed=grad == torch.float32 and finite,
              detail=f"after backward: weight grad dtype {grad}, finite {finite}"),
    ]
    return checks
