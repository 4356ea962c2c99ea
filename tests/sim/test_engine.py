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


# 1 layer, d = 16: 7,216 parameters, which 3, 5 and 6 do not divide (remainders 1, 1, 4), so
# the ring's chunks and ZeRO's flat shards are of unequal length. `shardlab simulate --dp 3`,
# `--dp 5 --zero 2` and `--dp 6 --zero 3` are tests/cli/test_simulate_cli.py's.
TINY = ModelShape("tiny", 1, 16, 2, V, 16, d_ff=24, style="llama", tied=False)


@pytest.mark.parametrize(("dp", "zero"), [(3, 2), (3, 3), (5, 0), (5, 3), (6, 0), (6, 2)])
def test_odd_dp_counted_bytes_equal_the_cost_model_per_rank(dp: int, zero: int) -> None:
    stream = batches(garden_documents(100, 1), dp, 16, seed=1)
    r = simulate_run(TINY, Parallel(dp=dp, zero=zero), [next(stream)], torch.float64)
    counted, predicted = r.comm["dp"]["counted_bytes"], r.comm["dp"]["predicted_bytes"]
    assert r.passed and counted == predicted  # exact, per rank
    assert len(set(counted)) > 1  # the ranks really sent different bytes
    assert [s["counted"] for s in r.state_bytes] == [s["predicted"] for s in r.state_bytes]


def test_tensor_parallel_on_uneven_activations_is_exact_per_rank() -> None:
    # head_dim given (3 heads of 8, d = 32): tp = 3 divides neither b·s·d (2 x 31 x 32) nor,
    # with sequence parallelism, the norm weights whose gradients it all-reduces.
    odd = ModelShape("odd", 1, 32, 3, V, 33, head_dim=8, d_ff=48, style="llama", tied=False)
    for par, seq in ((Parallel(tp=3), 31), (Parallel(tp=3, sp=True), 33)):
        stream = batches(garden_documents(100, 1), 2, seq, seed=1)
        r = simulate_run(odd, par, [next(stream)], torch.float64)
        counted = r.comm["tp"]["counted_bytes"]
        assert r.passed and counted == r.comm["tp"]["predicted_bytes"]
        assert len(set(counted)) > 1, par


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
