"""The expert-parallel all-to-all of the step-time model against measured latencies.

Megatron-Core's MoE report (NVIDIA, "Scalable Training of Mixture-of-Experts Models with
Megatron Core", arXiv 2603.07685, March 2026, Section 4.2.2, Table 7 "EP Scaling Performance
for HybridEP and all-to-all (in µs)") times one dispatch and one combine "with hidden size
7168, sequence length 4096, and 256 experts under multiple EP sizes", NCCL's all-to-all
dispatcher against HybridEP (token-based, like DeepEP: ``dispatcher=flex`` here), and says
"The table reports communication latency only". Each H100 cell is priced here by
:func:`shardlab.plan.expert_time.alltoall_seconds`, the function ``shardlab plan`` times
every MoE layer's all-to-alls with, on the same links (H100: NVLink 4 inside a DGX node of
8, the rank's one 400 Gb/s NIC across nodes, at the H100 curve's ``link_fraction``; GB200:
NVLink 5 across the whole NVL72 domain, at the Blackwell curve's, the H100 fit's 80%).
No constant is fitted on these cells. What the report leaves unstated is assumed and said:
DeepSeek-V3's top-8 routing with its group limit (the report's model for these sizes; its
config.json: 8 groups of 32 experts, each token's experts from its best 4), 4096 tokens per
rank (micro-batch 1), a bf16 payload, and random logits (``routing=random``: what
Megatron-Core's forced balance draws, routed through the limit). The group limit joined
in the tenth revision of docs/validation.md, after the uniform draw's excess at 4 or more
nodes was known; both figures are there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.config.model import ModelShape, MoE
from shardlab.plan.comm_time import pick_link
from shardlab.plan.efficiency import efficiency_of
from shardlab.plan.expert_time import alltoall_seconds, ep_members_per_node
from shardlab.plan.search import layout_candidates
from shardlab.plan.space import Space

SOURCE = ("Megatron-Core MoE report (arXiv 2603.07685), Table 7 'EP Scaling Performance for "
          "HybridEP and all-to-all (in µs)'")
SEQ = 4096
GPUS = {"H100 SXM": 8, "GB200": 72}
"""The report's two systems and the devices of each that share one NVLink domain."""

LAYER = ModelShape(
    "deepseek-v3-moe-layer", 61, 7168, 128, vocab=129280, context=SEQ, kv_heads=128,
    d_ff=18432, style="llama", tied=False,
    moe=MoE(experts=256, experts_per_token=8, expert_d_ff=2048, groups=8, group_topk=4),
    source="DeepSeek-V3 config.json (hidden 7168, 256 routed experts, 8 per token from the "
           "best 4 of 8 groups, expert FFN 2048); only the MoE layer's hidden size, experts, "
           "top-k and group limit enter the all-to-all")


@dataclass(frozen=True)
class AlltoallCell:
    """One measured cell: the ``gpu``, ``dispatcher`` (``alltoall``: NCCL; ``flex``:
    HybridEP), the ep size, ``op`` (dispatch or combine) and the measured microseconds."""

    gpu: str
    dispatcher: str
    ep: int
    op: str
    measured_us: float


_TABLE_7 = {  # (dispatch, combine) µs per ep size
    "H100 SXM": {
        "flex": {8: (661, 624), 16: (1485, 1688), 32: (3064, 3088), 64: (4626, 4398)},
        "alltoall": {8: (1265, 1277), 16: (5774, 5628), 32: (8059, 7815), 64: (9164, 8727)}},
    "GB200": {
        "flex": {8: (391, 353), 16: (578, 527), 32: (612, 646), 64: (675, 744)},
        "alltoall": {8: (735, 741), 16: (743, 765), 32: (769, 758), 64: (930, 827)}},
}

CELLS: tuple[AlltoallCell, ...] = tuple(
    AlltoallCell(gpu, d, ep, op, float(us))
    for gpu, table in _TABLE_7.items() for d, sizes in table.items()
    for ep, pair in sizes.items()
    for op, us in zip(("dispatch", "combine"), pair, strict=True))


def predict_us(gpu: str, dispatcher: str, ep: int) -> float:
    """The model's microseconds for one all-to-all of ``dispatcher`` over an ep group of
    ``ep`` ``gpu`` devices (:data:`GPUS` per NVLink domain): the report's layer at
    micro-batch 1 and sequence 4096."""
    acc = get_accelerator(gpu)
    eff = efficiency_of(acc)
    c = layout_candidates(LAYER, Space(gpus=ep, global_batch=ep, seq=SEQ,
                                       gpus_per_node=GPUS[gpu]),
                          f"dp={ep} ep={ep} micro_batch=1")
    inside = np.ones(len(c), bool)
    nvlink = pick_link(inside, acc.intra_link, acc.inter_link, eff.link_fraction)
    network = pick_link(~inside, acc.intra_link, acc.inter_link, eff.link_fraction)
    per_node = ep_members_per_node(c, c.cp, GPUS[gpu])
    secs = alltoall_seconds(LAYER, c, SEQ, get_policy("bf16"), *nvlink, dispatcher, "random",
                            network, per_node)
    return float(secs[0]) * 1e6


def alltoall_errors(gpu: str | None = None, dispatcher: str | None = None) -> np.ndarray:
    """Relative errors (predicted / measured - 1) of the cells, or of one gpu's or one
    dispatcher's, in :data:`CELLS` order."""
    return np.array([predict_us(c.gpu, c.dispatcher, c.ep) / c.measured_us - 1
                     for c in CELLS if gpu in (None, c.gpu)
                     and dispatcher in (None, c.dispatcher)])


def alltoall_table() -> str:
    """The markdown of docs/validation.md's all-to-all section: per cell the measured and
    predicted microseconds and the error, then each dispatcher's mean and worst."""
    lines = ["| GPU | dispatcher | EP | NVLink domains | op | measured µs | predicted µs "
             "| error |", "|---|---|---|---|---|---|---|---|"]
    names = {"alltoall": "NCCL all-to-all", "flex": "HybridEP (flex)"}
    for c in CELLS:
        pred = predict_us(c.gpu, c.dispatcher, c.ep)
        domains = -(-c.ep // GPUS[c.gpu])
        lines.append(f"| {c.gpu} | {names[c.dispatcher]} | {c.ep} | {domains} | {c.op} | "
                     f"{c.measured_us:,.0f} | {pred:,.0f} | "
                     f"{pred / c.measured_us - 1:+.1%} |")
    lines.append("")
    for gpu in GPUS:
        for d, name in names.items():
            e = np.abs(alltoall_errors(gpu, d))
            lines.append(f"{gpu}, {name}: mean absolute error {e.mean():.1%} over {len(e)} "
                         f"cells, worst {e.max():.1%}")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(f"{SOURCE}\n")
    print(alltoall_table(), end="")
