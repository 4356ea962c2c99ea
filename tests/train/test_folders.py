"""``shardlab.train.folders``: a folder flag's path refused with one SpecError."""

from __future__ import annotations

import pytest

from shardlab.errors import SpecError
from shardlab.train.folders import check_folder


def test_a_name_too_long_for_the_file_system_is_one_error() -> None:
    with pytest.raises(SpecError, match=r"log_dir=.*is not a usable path"):
        check_folder("log_dir", "x" * 10_000)
