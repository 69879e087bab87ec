"""The run's spending cap (`--max-cost`): a hard cap, checked before a call is sent.

    budget = Budget(max_cost=20.0)
    refusal = budget.admit(alias, input_estimate, output_estimate)  # None: may send
    reserved = budget.reserve(alias, input_estimate, output_estimate)
    cost = budget.settle(reserved, alias, usage)                     # what it cost

A call's worst case (its prompt estimate plus max_tokens, at the alias's
prices) is reserved before it is sent and released when it ends, so calls in
flight together cannot overshoot the cap; `spent` counts what the replies
reported. The dispatcher (engine/dispatch.py) is the only caller.
"""
from __future__ import annotations

from engine.config import ModelAlias
from providers.base import BUDGET, ProviderError


def safe_cost(alias: ModelAlias, input_tokens: int, output_tokens: int) -> float:
    """The alias's cost of a call; 0 when its prices cannot be used (the
    config's schema refuses such prices at load, so this is a last guard)."""
    try:
        cost = float(alias.cost(input_tokens, output_tokens))
    except Exception:  # noqa: BLE001
        return 0.0
    return cost if cost == cost and cost >= 0.0 else 0.0


class Budget:
    """Spending so far, spending reserved by calls in flight, and the cap."""

    __slots__ = ("max_cost", "spent", "reserved")

    def __init__(self, max_cost: float | None = None) -> None:
        self.max_cost = max_cost
        self.spent = 0.0
        self.reserved = 0.0

    def admit(self, alias: ModelAlias, input_tokens: int, output_tokens: int) -> ProviderError | None:
        """None when a call of this size may be sent; else the budget error
        that settles it unsent."""
        if self.max_cost is None:
            return None
        estimate = safe_cost(alias, input_tokens, output_tokens)
        if estimate > 0 and self.spent + self.reserved + estimate > self.max_cost:
            return ProviderError(BUDGET, f"not sent: max cost ${self.max_cost:.2f} reached "
                                         f"(spent ${self.spent:.2f}, this call up to ${estimate:.4f})")
        return None

    def reserve(self, alias: ModelAlias, input_tokens: int, output_tokens: int) -> float:
        """Hold a sent call's worst case; returns the amount to `settle` later."""
        reserved = safe_cost(alias, input_tokens, output_tokens)
        self.reserved += reserved
        return reserved

    def settle(self, reserved: float, alias: ModelAlias, usage: tuple[int, int] | None) -> float:
        """Release a call's reservation and count what it cost (0 without a
        reply). Raises what the alias's prices raise: the caller settles the
        call as an error, never hangs."""
        self.reserved -= reserved
        if usage is None:
            return 0.0
        cost = float(alias.cost(usage[0], usage[1]))
        self.spent += cost
        return cost
