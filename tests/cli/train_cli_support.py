"""What the ``shardlab train`` CLI tests share: the flags of issue 16's tiny mixture of
experts (8 experts, top-2, one shared expert, one dense layer).

Imported by ``test_train_cli.py`` (its real runs) and ``test_train_cli_bad_input.py``."""

from __future__ import annotations

MOE = ["--layers", "3", "--d-model", "32", "--experts", "8", "--top-k", "2",
       "--shared-experts", "1", "--dense-layers", "1", "--expert-d-ff", "32"]
