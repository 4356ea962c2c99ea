"""Fixtures the command tests share (``cpu_home`` lives in tests/conftest.py)."""
