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
The buckets live in the process, or, under ``cfmaps serve --workers N``, in a file every
process maps (:class:`SharedBuckets`, in the run directory of :mod:`app.siblings`): each
process kept its own before, so a client spreading its requests got up to N times the
limit.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .errors import RateLimitedError

# Buckets kept before full (idle) ones are dropped: bounds the memory an address scan costs.
_MAX_CLIENTS = 10_000


@dataclass
class _Bucket:
    level: float
    stamp: float


class _Buckets(Protocol):
    """Where the buckets are kept: :class:`LocalBuckets` or :class:`SharedBuckets`."""

    def open(self, key: str, now: float, create: bool) -> AbstractContextManager[_Bucket | None]:
        ...


class LocalBuckets:
    """The buckets of one process, in a dict."""

    def __init__(self, capacity: float, rate: float) -> None:
        self.capacity = capacity
        self.rate = rate
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    @contextmanager
    def open(self, key: str, now: float, create: bool) -> Iterator[_Bucket | None]:
        """The bucket of ``key`` (a full new one when it has none and ``create``, else
        None), to read and change while no other request does."""
        with self._lock:
            b = self._buckets.get(key)
            if b is None and create:
                if len(self._buckets) >= _MAX_CLIENTS:
                    self._drop_idle(now)
                b = self._buckets[key] = _Bucket(self.capacity, now)
            yield b

    def _drop_idle(self, now: float) -> None:
        for k in [k for k, b in self._buckets.items()
                  if b.level + (now - b.stamp) * self.rate >= self.capacity]:
            del self._buckets[k]


# A slot of the shared file: the key's hash (0: empty), the level and its time stamp.
_SLOT = struct.Struct("<Qdd")
_SLOTS = 16_384  # 384 KiB
_PROBES = 32  # slots looked at per key (open addressing)


class SharedBuckets:
    """The buckets of every process of one ``cfmaps serve``, in a file they all map.

    Each update holds an exclusive ``flock`` on the file (and a lock among the process's
    own threads, which share its open file): a few microseconds a request. Clients are
    slots found by their key's hash; when all the slots a key may take are held by other
    clients, the one whose bucket is fullest gives its slot up, bucket and all: the
    newcomer starts from that bucket's level (full when it was idle, as the in-process
    buckets drop idle ones), so being pushed out never refills anyone's allowance; past
    16,384 clients active within a minute, some share. ``time.monotonic`` is the
    system's clock, the same in every process.
    """

    def __init__(self, path: str | os.PathLike[str], capacity: float, rate: float) -> None:
        self.capacity = capacity
        self.rate = rate
        size = _SLOTS * _SLOT.size
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:  # the first process; zeros are empty slots
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._lock = threading.Lock()

    @staticmethod
    def _hash(key: str) -> int:
        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") or 1

    def _slot(self, h: int, now: float, create: bool) -> int | None:
        empty = victim = -1
        fullest = -math.inf
        for i in range(_PROBES):
            s = (h + i) % _SLOTS
            held, level, stamp = _SLOT.unpack_from(self._map, s * _SLOT.size)
            if held == h:
                return s
            if held == 0:
                if empty < 0:
                    empty = s
            elif level + max(0.0, now - stamp) * self.rate > fullest:
                fullest = level + max(0.0, now - stamp) * self.rate
                victim = s
        if not create:
            return None
        return empty if empty >= 0 else victim

    @contextmanager
    def open(self, key: str, now: float, create: bool) -> Iterator[_Bucket | None]:
        """As :meth:`LocalBuckets.open`; the bucket is written back when the block ends
        without an exception."""
        h = self._hash(key)
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                s = self._slot(h, now, create)
                if s is None:
                    yield None
                    return
                held, level, stamp = _SLOT.unpack_from(self._map, s * _SLOT.size)
                if held == h:
                    b = _Bucket(level, stamp)
                elif held == 0:
                    b = _Bucket(self.capacity, now)
                else:
                    # Another client's slot, the fullest of the window: the newcomer takes
                    # its bucket as it stands, so that no client gets answers back by being
                    # pushed out (a full window of spent buckets handed them fresh ones:
                    # QA, session 65). Clients past the slots share, never exceed.
                    b = _Bucket(min(self.capacity, level + max(0.0, now - stamp) * self.rate), now)
                yield b
                _SLOT.pack_into(self._map, s * _SLOT.size, h, b.level, b.stamp)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class RateLimiter:
    """Token buckets per client.

    Parameters
    ----------
    per_minute : int
        Answers a client may ask for per minute (also the largest burst).
    clock : callable, optional
        Seconds, monotonic (tests pass a fake one).
    shared : path-like, optional
        A directory shared with the other processes of one ``cfmaps serve``: the buckets
        are then in its file ``ratelimit.buckets`` (:class:`SharedBuckets`), so that the
        limit holds across them; else in this process.
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic,
                 shared: str | os.PathLike[str] | None = None) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self._clock = clock
        self._buckets: _Buckets = (
            LocalBuckets(self.capacity, self.rate) if shared is None
            else SharedBuckets(Path(shared) / "ratelimit.buckets", self.capacity, self.rate))

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
        with self._buckets.open(key, now, create=True) as b:
            assert b is not None
            # max(0, ...): a stamp ahead of the clock (a shared file kept over a reboot)
            # refills nothing
            b.level = min(self.capacity, b.level + max(0.0, now - b.stamp) * self.rate)
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
        with self._buckets.open(key, self._clock(), create=False) as b:
            if b is not None:
                b.level = min(self.capacity, b.level + cost)
