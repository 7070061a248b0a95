"""Dollar cost for vendors that report tokens only (codex, gemini), so budgets stop them too.

A lane's cost is what its vendor CLI reports (claude, opencode, aider, a command vendor's ``COST:`` line). When a
vendor reports tokens but no dollars, the tokens are priced from a table of USD per million input/output tokens:
``prices:`` in config.yaml (keyed by model or by vendor name), then the defaults below (list prices of each
built-in vendor's usual model when this was written; set ``prices:`` when yours differ). Cached input tokens are
counted at the input price, so a priced cost errs high, never low: a budget stops a lane early rather than late.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Price:
    input: float        # USD per million input tokens
    output: float       # USD per million output tokens


DEFAULT_PRICES: dict[str, Price] = {
    # built-in vendors (their usual default model)
    "codex": Price(1.25, 10.0), "gemini": Price(1.25, 10.0), "claude": Price(3.0, 15.0),
    "opencode": Price(3.0, 15.0), "aider": Price(3.0, 15.0), "grok": Price(0.20, 1.50),
    # models often named in lanes.<role>.model
    "gpt-5": Price(1.25, 10.0), "gpt-5-codex": Price(1.25, 10.0), "gpt-5-mini": Price(0.25, 2.0),
    "gemini-2.5-pro": Price(1.25, 10.0), "gemini-2.5-flash": Price(0.30, 2.50),
    "claude-sonnet-4-5": Price(3.0, 15.0), "claude-opus-4-1": Price(15.0, 75.0), "grok-code-fast-1": Price(0.20, 1.50),
}

# usage keys as each CLI reports them (codex/aider/claude: *_tokens; gemini: prompt/candidates/thoughts;
# opencode: input/output/reasoning/cache_*); codex's input_tokens already include its cached_input_tokens
_INPUT = ("input_tokens", "prompt", "input")
_INPUT_EXTRA = ("cache_creation_input_tokens", "cache_read_input_tokens", "cache_read", "cache_write")
_OUTPUT = ("output_tokens", "candidates", "output")
_OUTPUT_EXTRA = ("thoughts", "reasoning")


def tokens(usage: dict) -> tuple[int, int] | None:
    """(input, output) tokens from a vendor's usage dict, or None when it reports no tokens."""
    def first(keys):
        return next((int(usage[k]) for k in keys if isinstance(usage.get(k), (int, float))), None)

    inp, out = first(_INPUT), first(_OUTPUT)
    if inp is None and out is None:
        return None
    inp = (inp or 0) + sum(int(usage.get(k) or 0) for k in _INPUT_EXTRA if isinstance(usage.get(k), (int, float)))
    out = (out or 0) + sum(int(usage.get(k) or 0) for k in _OUTPUT_EXTRA if isinstance(usage.get(k), (int, float)))
    return inp, out


def price_for(vendor: str, model: str | None, table: dict[str, Price] | None = None) -> tuple[str, Price] | None:
    """(the key that matched, its price): config by model, config by vendor, defaults by model, defaults by vendor."""
    for source in (table or {}, DEFAULT_PRICES):
        for key in (model, vendor):
            if key and key in source:
                return key, source[key]
    return None


def priced_cost(vendor: str, model: str | None, usage: dict, table: dict[str, Price] | None = None) \
        -> tuple[float, str] | None:
    """(USD, what priced it) for ``usage`` when it holds tokens and a price is known, else None."""
    counted = tokens(usage or {})
    found = price_for(vendor, model, table)
    if counted is None or found is None:
        return None
    key, price = found
    inp, out = counted
    usd = round(inp * price.input / 1e6 + out * price.output / 1e6, 6)
    return usd, f"prices.{key}: {inp} input + {out} output tokens"
