"""The one error type a user can cause.

Every check of user input raises :class:`SpecError`; the command line turns it
into exit code 2 and a single line, never a traceback.
"""

from __future__ import annotations


class SpecError(ValueError):
    """Bad user input: names the field, the value given and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r}: {allowed}")


def require_positive_int(field: str, value: object) -> int:
    """Return ``value`` when it is an int >= 1 (bools refused), else raise SpecError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(field, value, "must be a positive integer")
    return value


def require_nonnegative_int(field: str, value: object) -> int:
    """Return ``value`` when it is an int >= 0 (bools refused), else raise SpecError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(field, value, "must be an integer >= 0")
    return value


def require_positive_number(field: str, value: object) -> float:
    """Return ``value`` as a float when it is a finite number > 0, else raise SpecError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, value, "must be a number > 0")
    x = float(value)
    if not (x > 0 and x != float("inf")):
        raise SpecError(field, value, "must be a finite number > 0")
    return x
