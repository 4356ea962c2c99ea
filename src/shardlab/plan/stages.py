"""Pipeline stages in the search: which ranks of each layout can be the busiest, as small
per-structure tables, for the layouts' even or uneven splits.

**Uneven splits** (:func:`shardlab.plan.choices.fewer_at_ends`). The embedding and the head
make the first and the last pipeline stage heavier than the others (the head's matmul is
2·d·V FLOPs a token, 2.4 layers of Llama 3 8B; rank 0 also keeps the most micro-batches
in flight under 1F1B). Frameworks give those stages fewer layers: torchtitan's
``pipeline_parallel_first_stage_less_layers`` and ``..._last_stage_less_layers`` (both 1
by default: the embedding and the head each count as that many layers, the L + 2k
"effective" layers are split evenly, the first chunks one larger when uneven, and the
first and the last chunk then give the k back; ``generate_llm_fqn_per_model_part``),
Megatron-LM's ``--account-for-embedding-in-pipeline-split`` /
``--account-for-loss-in-pipeline-split`` (k = 1) and
``--decoder-first/last-pipeline-num-layers``. Llama 3 405B ran "one Transformer layer each
from the first and the last stages" fewer (Dubey et al. 2024, Sec. 3.3.2): 126 layers on
16 stages as 7 + 14 x 8 + 7. The search tries that split for each k of
:attr:`shardlab.plan.space.Space.fewer_at_ends` beside the even one.

**Ranks compared.** Per distinct (pp, virtual stages, split, V placement), the layers
each pipeline rank holds and where the embedding (rank 0) and the head (the last chunk's
rank: pp - 1, or 0 in a V) sit. A rank's time per micro-batch is its layers times a
layer's time plus the embedding's and the head's, all >= 0, so among ranks with the same
extras the one with the most layers is the slowest: at most four ranks (no extras,
embedding, head, both) can be the busiest (:func:`timed_ranks`).
"""

from __future__ import annotations

import numpy as np

from shardlab.config.layout import SCHEDULES, V_SCHEDULES
from shardlab.estimate.partition import chunk_rank, rank_layers
from shardlab.plan.space import unique_rows

V_INDEX = tuple(SCHEDULES.index(s) for s in V_SCHEDULES)
TIMED = 4
"""Ranks :func:`timed_ranks` compares per layout (module docstring)."""


def rank_placement(layers: int, pp: int, v: int, split: tuple[int, ...], v_shape: bool
                   ) -> tuple[list[int], int]:
    """(layers on each pipeline rank, the head's rank) of one structure."""
    return (rank_layers(layers, pp, v, split, v_shape),
            chunk_rank(pp * v - 1, pp, v_shape))


def timed_ranks(layers: int, pp: np.ndarray, v: np.ndarray, split: np.ndarray,
                splits: tuple[tuple[int, ...], ...], schedule: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per layout, the :data:`TIMED` ranks that can be the busiest (module docstring), as
    (layers, embedding 0/1, head 0/1, rank index) arrays of shape [layouts, TIMED]
    (a structure with fewer kinds of rank repeats one). ``split`` indexes ``splits``."""
    v_shape = np.isin(schedule, V_INDEX)
    uniq, inv = unique_rows(pp, v, split, v_shape)
    table = np.zeros((len(uniq), 4, TIMED), dtype=np.int64)
    for i, (p, vs, s, vee) in enumerate(uniq.tolist()):
        per_rank, head = rank_placement(layers, p, vs, splits[s], bool(vee))
        best: dict[tuple[int, int], tuple[int, int]] = {}
        for r, n in enumerate(per_rank):
            kind = (int(r == 0), int(r == head))
            if kind not in best or n > best[kind][0]:
                best[kind] = (n, r)
        rows = [(n, e, h, r) for (e, h), (n, r) in best.items()]
        rows += [rows[0]] * (TIMED - len(rows))
        table[i] = np.array(rows).T
    t = table[inv.ravel()]
    return t[:, 0], t[:, 1], t[:, 2], t[:, 3]
