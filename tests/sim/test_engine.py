"""The simulator equals one device, and its counted bytes equal the cost model, per layout."""

import pytest
import torch

from shardlab.config.model import ModelShape
from shardlab.errors import SpecError
from shardlab.nn.data import Batch, batches
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.sim import run
from shardlab.sim.engine import Parallel
from shardlab.sim.run import layout_for, simulate_run

V = garden_vocab().size
LLAMA = ModelShape("llama", 4, 32, 4, V, 32, kv_heads=2, d_ff=64, style="llama", tied=False)
GPT = ModelShape("gpt", 4, 32, 4, V, 32, style="gpt", tied=True)


def _batches(n: int, size: int = 8) -> list[Batch]:
    stream = batches(garden_documents(300, 1), size, 32, seed=1)
    return [next(stream) for _ in range(n)]


LAYOUTS = [
    Parallel(dp=4),                                                  # data parallel
    Parallel(dp=2, zero=1, microbatches=2),                          # ZeRO-1
    Parallel(dp=2, zero=2),                                          # ZeRO-2
    Parallel(dp=4, zero=3, microbatches=2),                          # ZeRO-3 (FSDP)
    Parallel(tp=2),                                                  # Megatron TP
    Parallel(tp=2, sp=True, microbatches=2),                         # TP + sequence parallel
    Parallel(pp=2, microbatches=4),                                  # 1F1B
    Parallel(pp=4, microbatches=4, schedule="gpipe"),                # GPipe
    Parallel(dp=2, tp=2, pp=2, microbatches=2, zero=1, sp=True),     # 3D
    Parallel(dp=2, tp=2, pp=2, microbatches=2, zero=3),              # 3D with ZeRO-3
]


@pytest.mark.parametrize("shape", [LLAMA, GPT], ids=["llama", "gpt"])
@pytest.mark.parametrize("par", LAYOUTS, ids=lambda p: f"dp{p.dp}tp{p.tp}pp{p.pp}z{p.zero}"
                         f"{'sp' if p.sp else ''}{p.schedule}")
def test_float64_layout_equals_one_device_and_the_cost_model(shape: ModelShape,
                                                             par: Parallel) -> None:
    r = simulate_run(shape, par, _batches(2), torch.float64)
    failed = [(c.name, c.value, c.tolerance) for c in r.checks if not c.passed]
    assert not failed, failed
    assert r.max_param_diff <= 1e-12 and r.max_loss_diff <= 1e-12
    # The comparison is not vacuous: this layout really moved the bytes it claims.
    kinds = {"dp": par.dp > 1, "tp": par.tp > 1, "pp": par.pp > 1}
    for kind, expected in kinds.items():
        assert any(r.comm[kind]["counted_bytes"]) == expected, kind


def test_float32_within_1e5() -> None:
    r = simulate_run(LLAMA, Parallel(dp=2, tp=2, pp=2, microbatches=2, zero=2, sp=True),
                     _batches(3), torch.float32)
    assert r.passed and r.max_param_diff < 1e-5 and r.max_loss_diff < 1e-5


def test_checks_fail_when_the_cost_model_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    real = run.tp_bytes_per_stage
    monkeypatch.setattr(run, "tp_bytes_per_stage",
                        lambda *a, **k: [x + 4 for x in real(*a, **k)])
    r = simulate_run(LLAMA, Parallel(tp=2), _batches(1), torch.float64)
    assert not r.passed and [c.name for c in r.checks if not c.passed] == ["comm.tp"]


def test_state_bytes_follow_zero() -> None:
    full = simulate_run(LLAMA, Parallel(dp=4), _batches(1), torch.float64).state_bytes[0]
    z3 = simulate_run(LLAMA, Parallel(dp=4, zero=3), _batches(1), torch.float64).state_bytes[0]
    for part in ("weights", "gradients", "optimizer"):
        assert z3["counted"][part] * 4 == full["counted"][part]


@pytest.mark.parametrize(("par", "field"), [
    (Parallel(tp=3), "tp"), (Parallel(pp=5), "pp"), (Parallel(sp=True), "sp"),
    (Parallel(dp=3), "global_batch"),
])
def test_bad_layouts_refused_before_work(par: Parallel, field: str) -> None:
    with pytest.raises(SpecError) as e:
        layout_for(LLAMA, par, 8, 32, torch.float32)
    assert e.value.field == field
