"""What a served agent model costs: a price table keyed by model name, and where an unknown name costs 0.

    >>> from agent_trainer.prices import agent_prices
    >>> agent_prices("gpt-4.1-mini", None)                                # the OpenAI API
    (0.4, 1.6, 'price table')
    >>> agent_prices("SmolLM2-135M-Instruct", "http://127.0.0.1:8000/v1")  # a local server
    (0.0, 0.0, 'local server')

USD per 1M tokens (input, output); ``agent.usd_per_1m_tokens_in`` / ``..._out`` override them. An unknown
model costs 0 on a local server and raises on any other (docs/agents.md, "A served agent").
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

# model -> (USD per 1M prompt tokens, USD per 1M completion tokens)
MODEL_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
    "o3": (2.00, 8.00),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
}
_DATED = re.compile(r"-\d{4}-\d{2}-\d{2}$")


class UnknownPrice(ValueError):
    """A model with no known price on a server that may bill; the message names the keys to set."""


def table_price(model: str) -> tuple[float, float] | None:
    """The table's (input, output) price of ``model`` or of its undated name; None when not listed."""
    return MODEL_PRICES.get(model) or MODEL_PRICES.get(_DATED.sub("", model))


def is_local_url(base_url: str | None) -> bool:
    """True for a server on this machine or this network (None is the OpenAI API: not local)."""
    if not base_url:
        return False
    host = (urlsplit(base_url).hostname or "").lower()
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost") or host.endswith(".local") or "." not in host.strip("[]"):
        try:  # an IPv6 literal has no dots either: judge it by its address
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return True
        return ip.is_loopback or ip.is_private or ip.is_link_local
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a DNS name with dots: anywhere
    return ip.is_loopback or ip.is_private or ip.is_link_local


def agent_prices(model: str, base_url: str | None, price_in: float | None = None,
                 price_out: float | None = None) -> tuple[float, float, str]:
    """``(in, out, source)`` USD per 1M tokens of ``model`` served at ``base_url``.

    Given prices win (one given, the other from the table or 0); else the table; else 0 on a local
    server; else ``UnknownPrice``."""
    listed = table_price(model)
    if price_in is not None and price_out is not None:
        return float(price_in), float(price_out), "config"
    if price_in is not None or price_out is not None:
        base = listed or (0.0, 0.0)
        return (float(price_in) if price_in is not None else base[0],
                float(price_out) if price_out is not None else base[1], "config")
    if listed is not None:
        return listed[0], listed[1], "price table"
    if is_local_url(base_url):
        return 0.0, 0.0, "local server"
    where = base_url or "the OpenAI API"
    raise UnknownPrice(f"agent.model {model!r} has no known price and {where} is not a local server; set "
                       f"agent.usd_per_1m_tokens_in and agent.usd_per_1m_tokens_out (USD per 1M tokens; 0 for a "
                       f"free server) so the ledger and the budget caps count what it costs")
