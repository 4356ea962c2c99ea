"""What the Hugging Face config.json tests share: the fixtures under data/hf/, the catalog
entries they match with their exact parameter counts, and edited copies of them.

Imported by ``test_hf_config.py`` and ``test_hf_config_refusals.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "hf"

CATALOG_CASES = [
    ("llama-3-8b", 8_030_261_248),
    ("mistral-7b", 7_241_732_096),
    ("mixtral-8x7b", 46_702_792_704),
    ("qwen2.5-7b", 7_615_616_512),
    # Qwen3: the published files' fields (written out here), q_norm/k_norm included.
    ("qwen3-8b", 8_190_735_360),
    ("qwen3-30b-a3b", 30_532_122_624),
    ("qwen3-235b-a22b", 235_093_634_560),
    ("gpt2", 124_439_808),
]


def fixture(stem: str) -> dict[str, Any]:
    """The parsed fixture ``data/hf/<stem>.json``."""
    return json.loads((DATA / f"{stem}.json").read_text())


def write(tmp_path: Path, config: object, filename: str = "config.json") -> Path:
    """``config`` as JSON in a fresh file under tmp_path."""
    path = tmp_path / filename
    path.write_text(json.dumps(config))
    return path


def edited(tmp_path: Path, stem: str, **changes: object) -> Path:
    """The fixture ``stem`` with ``changes`` applied (a value of ... deletes the key)."""
    config = fixture(stem)
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    return write(tmp_path, config)
