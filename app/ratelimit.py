"""Optional per-client rate limits on the query routes (``CFMAPS_RATE_LIMIT_PER_MINUTE``).

Why a counterfactual service wants them: every answer hands out a certified box in which
the model's decision is constant, and its nearest boundary. Enough answers, chosen well,
reconstruct the forest's decision regions, which a model owner may consider as valuable
as the model. A limit per client bounds how fast anyone can collect them.

A client is its bearer token when it sends one (the query routes have checked it by
then), else its address. Each client has a token bucket that holds a minute's allowance
and refills continuously; a request costs one per answer it asks for (instances times
``k`` for counterfactuals, instances for predictions, one per 1,024 pixels for a map
picture), so batches and pictures cannot get around it.
The buckets live in the process: with ``cfmaps serve --workers N`` each process keeps its
own, so a client may get up to N times the limit (requests spread over the processes).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import RateLimitedError

# Buckets kept before full (idle) ones are dropped: bounds the memory an address scan costs.
_MAX_CLIENTS = 10_000


@dataclass
class _Bucket:
    level: float
    stamp: float


class RateLimiter:
    """Token buckets per client.

    Parameters
    ----------
    per_minute : int
        Answers a client may ask for per minute (also the largest burst).
    clock : callable, optional
        Seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    @staticmethod
    def client_key(token: str | None, address: str | None) -> str:
        """The bucket of a request: its token (hashed: no secret kept in memory twice),
        else its peer address."""
        if token:
            return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]
        return f"address:{address or 'unknown'}"

    def charge(self, key: str, cost: int, field: str = "instances",
               advice: str = "split it into smaller batches") -> None:
        """Take ``cost`` from the bucket of ``key``; a cost above the bucket's capacity is
        refused naming ``field``, with ``advice``.

        Raises
        ------
        RateLimitedError
            When the bucket holds less (nothing is taken then), with ``Retry-After``.
        """
        now = self._clock()
        with self._lock:
            b = self._buckets.get(key)
            if b is None:
                if len(self._buckets) >= _MAX_CLIENTS:
                    self._drop_idle(now)
                b = self._buckets[key] = _Bucket(self.capacity, now)
            b.level = min(self.capacity, b.level + (now - b.stamp) * self.rate)
            b.stamp = now
            if cost <= b.level:
                b.level -= cost
                return
            missing = cost - b.level
        limit = int(self.capacity)
        if cost > self.capacity:
            # no Retry-After: waiting never lets it through
            raise RateLimitedError(
                f"this request asks for {cost} answers, more than the limit of {limit} per "
                f"minute; {advice}",
                field,
            )
        wait = max(1, math.ceil(missing / self.rate))
        raise RateLimitedError(
            f"rate limit of {limit} answers per minute reached; retry in {wait} s",
            None,
            {"Retry-After": str(wait)},
        )

    def refund(self, key: str, cost: int) -> None:
        """Give back ``cost`` taken by :meth:`charge` for a request refused as bad input
        (which costs the client nothing, as on the routes that validate before charging)."""
        with self._lock:
            b = self._buckets.get(key)
            if b is not None:
                b.level = min(self.capacity, b.level + cost)

    def _drop_idle(self, now: float) -> None:
        for k in [k for k, b in self._buckets.items()
                  if b.level + (now - b.stamp) * self.rate >= self.capacity]:
            del self._buckets[k]
