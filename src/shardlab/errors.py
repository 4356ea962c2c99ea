"""The one error type a user can cause.

Every check of user input raises :class:`SpecError`; the command line turns it
into exit code 2 and a single line, never a traceback.
"""

from __future__ import annotations

SHOWN_CHARACTERS = 160
"""How much of an over-long value an error line echoes (characters of its ``repr``): a file
path must reach the user whole (a deep temporary or project folder runs past 100
characters), and pasted garbage still stays one line."""


def clip(text: str, keep: int = SHOWN_CHARACTERS) -> str:
    """``text`` when it is at most ``keep`` characters, else its first ``keep`` and how many
    more there are, so an error line stays one readable line whatever the user typed."""
    if len(text) <= keep:
        return text
    more = len(text) - keep
    return f"{text[:keep]}... ({more:,} more character{'s' if more > 1 else ''})"


class SpecError(ValueError):
    """Bad user input: names the field, the value given and what is allowed.

    The message echoes the value's ``repr`` cut to :data:`SHOWN_CHARACTERS` characters
    (:func:`clip`); ``value`` keeps it whole.
    """

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={clip(repr(value))}: {allowed}")


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


def require_int_at_most(field: str, value: int, limit: int) -> int:
    """Return ``value`` when it is <= ``limit``, else raise SpecError stating the limit (as
    a power of two too when it is one: ``must be <= 1,048,576 (2^20)``)."""
    if value > limit:
        power = f" (2^{limit.bit_length() - 1})" if limit > 2 and limit & (limit - 1) == 0 else ""
        raise SpecError(field, value, f"must be <= {limit:,}{power}")
    return value


def require_positive_number(field: str, value: object) -> float:
    """Return ``value`` as a float when it is a finite number > 0, else raise SpecError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, value, "must be a number > 0")
    x = float(value)
    if not (x > 0 and x != float("inf")):
        raise SpecError(field, value, "must be a finite number > 0")
    return x


def require_number_in(field: str, value: object, low: float, high: float, unit: str) -> float:
    """Return ``value`` as a float when it is a number from ``low`` to ``high`` (a physical
    quantity in ``unit``: far outside the range it is a typo, and the figures computed from
    it overflow or lose all precision), else raise SpecError naming the range."""
    x = require_positive_number(field, value)
    if not low <= x <= high:
        raise SpecError(field, value, f"must be from {low:g} to {high:g} {unit}")
    return x
