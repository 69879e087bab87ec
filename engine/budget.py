"""The run's spending cap (`--max-cost`): a hard cap, checked before a call is sent.

    budget = Budget(max_cost=20.0, spent_before=3.5)   # 3.5: spent by earlier invocations of the run
    refusal = budget.admit(alias, input_estimate, output_estimate)  # None: may send
    reserved = budget.reserve(alias, input_estimate, output_estimate)
    cost = budget.settle(reserved, alias, result)                    # what it cost (a result that came by
                                                                     # batch, `result.batched`: discounted)
    budget.paid()                                                    # (USD, calls) this invocation paid

A call's worst case (its prompt estimate plus max_tokens, at the alias's
prices) is reserved before it is sent and released when it ends, so calls in
flight together cannot overshoot the cap; `spent` counts what the replies
reported (prompt-cache reads and writes at their own prices). A call refused
only because of what calls in flight hold waits for them to settle
(`fits_after_inflight`, `wait_for_room`); one that cannot fit whatever they
cost is refused.
"""
from __future__ import annotations

from typing import Protocol

from engine.config import ModelAlias
from providers.base import BUDGET, ChatResult, ProviderError, Result


class Waiter(Protocol):
    """What waits for room in the budget (an endpoint's dispatcher)."""

    def wake(self) -> None: ...


def safe_cost(alias: ModelAlias, input_tokens: int, output_tokens: int, *, cache_read: int = 0,
              cache_write: int = 0, cache_write_1h: int = 0, batch: bool = False) -> float:
    """The alias's cost of a call; 0 when its prices cannot be used (the
    config's schema refuses such prices at load, so this is a last guard)."""
    try:
        cost = float(alias.cost(input_tokens, output_tokens, cache_read=cache_read, cache_write=cache_write,
                                cache_write_1h=cache_write_1h, batch=batch))
    except Exception:  # noqa: BLE001
        return 0.0
    return cost if cost == cost and cost >= 0.0 else 0.0


def worst_case(alias: ModelAlias, input_tokens: int, output_tokens: int, *, batch: bool = False) -> float:
    """The most a call of this size can cost: every prompt token at the
    dearest input price (a cache write may cost more than plain input; a
    batch writes the 1-hour cache, dearer still)."""
    plain = safe_cost(alias, input_tokens, output_tokens, batch=batch)
    written = safe_cost(alias, input_tokens, output_tokens, cache_write=input_tokens,
                        cache_write_1h=input_tokens if batch else 0, batch=batch)
    return max(plain, written)


class Budget:
    """Spending so far, spending reserved by calls in flight, and the cap."""

    __slots__ = ("max_cost", "spent", "spent_before", "paid_calls", "reserved", "_waiters")

    def __init__(self, max_cost: float | None = None, spent_before: float = 0.0) -> None:
        self.max_cost = max_cost
        # What earlier invocations of the same run already spent (the cache's spending
        # ledger, or run.json): the cap holds across resumes and folders.
        self.spent = spent_before
        self.spent_before = spent_before
        self.paid_calls = 0  # calls of this invocation whose reply came (and was priced)
        self.reserved = 0.0
        self._waiters: set[Waiter] = set()

    def fits_after_inflight(self, alias: ModelAlias, input_tokens: int, output_tokens: int, *,
                            batch: bool = False) -> bool:
        """True when a call `admit` refuses would fit once the calls in flight
        have settled (their worst case is held, what they cost is usually
        less): the call should wait for them (`wait_for_room`) rather than be
        refused. False: it cannot fit whatever they cost."""
        if self.max_cost is None or self.reserved <= 0:
            return False
        return self.spent + worst_case(alias, input_tokens, output_tokens, batch=batch) <= self.max_cost

    def wait_for_room(self, waiter: Waiter) -> None:
        """`waiter.wake()` is called at the next settlement."""
        self._waiters.add(waiter)

    def admit(self, alias: ModelAlias, input_tokens: int, output_tokens: int, *,
              batch: bool = False) -> ProviderError | None:
        """None when a call of this size may be sent; else the budget error
        that settles it unsent."""
        if self.max_cost is None:
            return None
        estimate = worst_case(alias, input_tokens, output_tokens, batch=batch)
        if estimate > 0 and self.spent + self.reserved + estimate > self.max_cost:
            return ProviderError(BUDGET, f"not sent: --max-cost ${self.max_cost:.2f} reached "
                                         f"(spent ${self.spent:.2f}, this call up to ${estimate:.4f})")
        return None

    def reserve(self, alias: ModelAlias, input_tokens: int, output_tokens: int, *, batch: bool = False) -> float:
        """Hold a sent call's worst case; returns the amount to `settle` later."""
        reserved = worst_case(alias, input_tokens, output_tokens, batch=batch)
        self.reserved += reserved
        return reserved

    def settle(self, reserved: float, alias: ModelAlias, result: Result | None, *, batch: bool = False) -> float:
        """Release a call's reservation and count what it cost (0 without a
        reply), from the reply's usage: its prompt-cache reads and writes at
        their prices, a result that came by batch (`ChatResult.batched`, or
        `batch=True`) at the batch discount. Raises what the
        alias's prices raise: the caller settles the call as an error, never hangs."""
        self.reserved -= reserved
        if self._waiters:
            waiters, self._waiters = self._waiters, set()
            for waiter in waiters:
                waiter.wake()
        if result is None:
            return 0.0
        if isinstance(result, ChatResult) and result.reported_cost is not None:
            cost = result.reported_cost  # the provider's own figure (OpenRouter usage.cost) counts first
        elif isinstance(result, ChatResult):
            cost = float(alias.cost(result.input_tokens, result.output_tokens, cache_read=result.cache_read_tokens,
                                    cache_write=result.cache_write_tokens,
                                    cache_write_1h=result.cache_write_1h_tokens, batch=batch or result.batched))
        else:
            cost = float(alias.cost(result.input_tokens, 0, batch=batch))
        self.spent += cost
        self.paid_calls += 1
        return cost

    def paid(self) -> tuple[float, int]:
        """What this invocation paid so far: (USD, calls), earlier invocations apart."""
        return max(0.0, self.spent - self.spent_before), self.paid_calls
