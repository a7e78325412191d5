"""HTTP routes: parse the request, call the registry or the engine, serialise the answer."""

from . import counterfactuals, health, models

__all__ = ["counterfactuals", "health", "models"]
