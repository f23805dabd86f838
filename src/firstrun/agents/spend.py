"""What model calls cost, and a sweep-wide spend cap that holds with parallel runs.

Guarantee: a price comes from the user's price file when it names the model,
else from the maintained ``genai-prices`` package, else it is unknown, and an
unknown price makes spend unknown (None), never zero: no cost is ever guessed.
Money is ``Decimal`` throughout, USD, written as a decimal string. Under
``SpendGovernor`` (``--max-spend``) a run starts only with a reservation that
fits under the cap, and spends past it by at most the turn that crossed it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Protocol

from firstrun.agents.vendor import TokenUsage
from firstrun.errors import UsageError
from firstrun.tasks.model import Budgets

_MILLION = Decimal(1_000_000)
# Tokens reserved for a run whose task sets no max_tokens. A run re-sends its
# growing conversation every turn, so a 20-turn run reading a few pages
# commonly bills a few hundred thousand input tokens; priced at the model's
# highest per-token rate this over-reserves, which only delays a run, while
# under-reserving would let the cap be passed.
DEFAULT_RUN_TOKENS = 500_000
# How often a run waiting for budget looks at the sweep's stop event.
_WAIT_S = 0.2


class Pricing(Protocol):
    """The price of one model. ``source`` names where it came from, for the record."""

    source: str

    def cost(self, usage: TokenUsage) -> Decimal | None:
        """The cost of one call in USD, or None when part of it has no price."""
        ...

    def highest_per_token(self) -> Decimal:
        """The highest USD rate of any one token, for reservations."""
        ...


@dataclass(frozen=True, kw_only=True)
class FilePrice:
    """USD per million tokens, from ``--price-file``. ``cached`` and
    ``cache_write`` are optional: usage that needs a missing one has no price."""

    model: str
    input: Decimal
    output: Decimal
    cached: Decimal | None = None
    cache_write: Decimal | None = None
    source: str = "price-file"

    def cost(self, usage: TokenUsage) -> Decimal | None:
        if usage.cached_tokens and self.cached is None:
            return None
        if usage.cache_write_tokens and self.cache_write is None:
            return None
        plain = usage.input_tokens - usage.cached_tokens - usage.cache_write_tokens
        total = plain * self.input + usage.output_tokens * self.output
        total += usage.cached_tokens * (self.cached or 0)
        total += usage.cache_write_tokens * (self.cache_write or 0)
        return total / _MILLION

    def highest_per_token(self) -> Decimal:
        rates = [self.input, self.output, self.cached or 0, self.cache_write or 0]
        return max(rates) / _MILLION


class GenaiPrice:
    """A model's price from ``genai-prices`` (its bundled data; it never fetches)."""

    def __init__(self, *, vendor: str, model: str) -> None:
        import genai_prices

        self._calc = genai_prices.calc_price
        self._usage = genai_prices.Usage
        self._vendor = vendor
        self._model = model
        self.source = f"genai-prices {genai_prices.__version__}"

    def cost(self, usage: TokenUsage) -> Decimal | None:
        try:
            priced = self._calc(
                self._usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                            cache_read_tokens=usage.cached_tokens,
                            cache_write_tokens=usage.cache_write_tokens),
                self._model, provider_id=self._vendor)
        except (LookupError, ValueError):
            # genai-prices' own errors for "no such model" and "usage it cannot price".
            return None
        return Decimal(priced.total_price)

    def highest_per_token(self) -> Decimal:
        # A million tokens of one kind reaches the highest tier a model has.
        rates = [self.cost(TokenUsage(input_tokens=1_000_000, output_tokens=0)),
                 self.cost(TokenUsage(input_tokens=0, output_tokens=1_000_000))]
        return max(r for r in rates if r is not None) / _MILLION


def price_for(vendor: str, model: str,
              price_file: Mapping[str, FilePrice] | None = None) -> Pricing | None:
    """The price of ``model`` at ``vendor``: the price file first, then genai-prices, else None."""
    if price_file is not None and model in price_file:
        return price_file[model]
    try:
        price = GenaiPrice(vendor=vendor, model=model)
    except ImportError:
        return None
    # A model genai-prices does not know prices nothing, so its price is unknown.
    if price.cost(TokenUsage(input_tokens=1, output_tokens=1)) is None:
        return None
    return price


def load_price_file(path: str | Path) -> dict[str, FilePrice]:
    """Read ``--price-file``: JSON or YAML, ``model: {input, output[, cached, cache_write]}``
    in USD per million tokens. Every problem is a ``UsageError`` naming the file."""
    import yaml

    where = f"--price-file: {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it ({exc.strerror})") from None
    is_json = str(path).endswith(".json")
    try:
        # safe_load builds plain data only.
        document = json.loads(text) if is_json else yaml.safe_load(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise UsageError(f"{where}: not valid {'JSON' if is_json else 'YAML'}: "
                         f"{' '.join(str(exc).split())}") from None
    if not isinstance(document, dict) or not document:
        raise UsageError(f"{where}: expected a mapping of model id to prices")
    return {str(model): _file_price(where, str(model), entry, source=f"price-file {path}")
            for model, entry in document.items()}


def _file_price(where: str, model: str, entry: Any, *, source: str) -> FilePrice:
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: {model}: expected input/output/cached prices per million tokens")
    unknown = set(entry) - {"input", "output", "cached", "cache_write"}
    if unknown:
        raise UsageError(f"{where}: {model}: unknown key {sorted(unknown)[0]!r} "
                         "(known: input, output, cached, cache_write)")
    for required in ("input", "output"):
        if required not in entry:
            raise UsageError(f"{where}: {model}: {required!r} is required (USD per million tokens)")

    def rate(key: str) -> Decimal | None:
        if key not in entry:
            return None
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise UsageError(f"{where}: {model}: {key} must be a number")
        try:
            number = Decimal(str(value))
        except InvalidOperation:
            raise UsageError(f"{where}: {model}: {key} must be a number, not {value!r}") from None
        if not number.is_finite() or number < 0:
            raise UsageError(f"{where}: {model}: {key} must be a non-negative number")
        return number

    price_input, price_output = rate("input"), rate("output")
    assert price_input is not None and price_output is not None
    return FilePrice(model=model, input=price_input, output=price_output, cached=rate("cached"),
                     cache_write=rate("cache_write"), source=source)


@dataclass(frozen=True, kw_only=True)
class Reservation:
    """Budget held for one run; ``amount`` is that run's spend limit."""

    number: int
    amount: Decimal


# A run starts only after it has reserved its amount under the cap, and the
# reservation is the run's own spend limit, which the tool-use loop enforces
# between turns (so a run can pass it by at most the turn that crossed it).
# When a run ends its reservation is settled at the actual spend, or kept whole
# when that is unknown. When the next reservation cannot fit and no run in
# flight could free budget, no new run starts. Reserving before starting, never
# checking after, is what makes the cap hold with ``--workers`` above 1.
class SpendGovernor:
    """The sweep-wide ``--max-spend`` cap; every method is thread-safe."""

    def __init__(self, *, cap: Decimal, pricing: Pricing,
                 run_tokens: int = DEFAULT_RUN_TOKENS) -> None:
        if cap <= 0:
            raise UsageError("--max-spend must be a positive amount of USD")
        self.cap = cap
        self._pricing = pricing
        self._run_tokens = run_tokens
        self._cond = threading.Condition()
        self._settled = Decimal(0)
        self._held: dict[int, Decimal] = {}
        self._count = 0
        self._refused = False

    def estimate(self, budgets: Budgets) -> Decimal:
        """A run's reservation: its task's max_tokens (else ``run_tokens``) at the highest rate."""
        tokens = budgets.max_tokens if budgets.max_tokens > 0 else self._run_tokens
        return tokens * self._pricing.highest_per_token()

    def reserve(self, budgets: Budgets, *,
                stop: threading.Event | None = None) -> Reservation | None:
        """Hold a run's reservation, waiting while runs in flight may still free
        budget; None when it cannot fit (the cap is reached) or ``stop`` is set."""
        amount = self.estimate(budgets)
        with self._cond:
            while True:
                if stop is not None and stop.is_set():
                    return None
                if self._settled + sum(self._held.values()) + amount <= self.cap:
                    self._count += 1
                    self._held[self._count] = amount
                    return Reservation(number=self._count, amount=amount)
                if not self._held or self._settled + amount > self.cap:
                    self._refused = True
                    return None
                self._cond.wait(_WAIT_S)

    def settle(self, reservation: Reservation, actual: Decimal | None) -> None:
        """Replace ``reservation`` by what the run spent; unknown keeps it whole."""
        with self._cond:
            held = self._held.pop(reservation.number)
            self._settled += held if actual is None else actual
            self._cond.notify_all()

    @property
    def spent(self) -> Decimal:
        """Settled spend so far (reservations settled unknown count whole)."""
        with self._cond:
            return self._settled

    @property
    def reached(self) -> bool:
        """True once a run was refused because its reservation would pass the cap."""
        with self._cond:
            return self._refused
