"""Domain bounds on the numbers a write tool accepts (bags, money), shared by the τ²-style toolkits.

The JSON schema says only "integer" or "number"; a model (or a fuzzer) can still send ``NaN``,
``1e30`` or 10^30 bags, and a tool that stores them corrupts the episode's database (a certificate
worth NaN makes every later balance NaN). These checks run inside the tools, before any mutation, and
raise :class:`~trace_envs.core.tools.ToolError` with a message that says what is allowed, so the
agent gets an error observation it can act on and the database stays unchanged.

The limits come from the domain, not from the machine: no τ²-bench reservation carries more than a
handful of bags per passenger and no fare, balance or certificate in its data is above a few
thousand dollars, so the bounds are generous for real use and tight enough to keep sums exact.
"""

from __future__ import annotations

import math

from ..core.tools import ToolError

#: Checked bags per passenger a reservation may hold (τ²-bench's data has at most 4 per passenger).
MAX_BAGS_PER_PASSENGER = 10
#: The largest amount of money (dollars) one payment, refund or certificate may carry.
MAX_AMOUNT = 100_000.0


def check_count(name: str, value: int, maximum: int) -> int:
    """``value`` as a non-negative whole number at most ``maximum``; a ToolError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and (not math.isfinite(value) or value != int(value))):
        raise ToolError(f"{name} must be a whole number, got {value!r}.")
    if value < 0 or value > maximum:
        raise ToolError(f"{name} must be between 0 and {maximum}, got {value!r}.")
    return int(value)


def check_amount(name: str, value: float, *, allow_zero: bool = True) -> float:
    """``value`` as a finite amount of money in [0, MAX_AMOUNT] (in (0, MAX_AMOUNT] without ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolError(f"{name} must be a number of dollars, got {value!r}.")
    if not math.isfinite(value):
        raise ToolError(f"{name} must be a finite number of dollars, got {value!r}.")
    if value == 0 and not allow_zero:
        raise ToolError(f"{name} must be positive, got {value!r}.")
    if value < 0:
        raise ToolError(f"{name} cannot be negative, got {value!r}.")
    if value > MAX_AMOUNT:
        raise ToolError(f"{name} is {value!r}, above the largest amount this system handles (${MAX_AMOUNT:,.0f}).")
    return value
