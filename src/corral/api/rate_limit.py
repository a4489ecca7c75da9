"""Rate limits on writes, per token: a token bucket each, in this process's memory.

A token may make BURST writes at once and RATE a second sustained; a write over the
limit is answered 429 with `Retry-After`. The buckets live in memory: a restart fills
them again, and servers sharing one PostgreSQL store each keep their own. Set by
CORRAL_WRITE_RATE and CORRAL_WRITE_BURST (0 turns the limit off).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time

DEFAULT_RATE = 200.0
DEFAULT_BURST = 2000.0
# Beyond this many buckets, the full ones (tokens idle long enough) are dropped, so that
# requests with made-up tokens cannot grow the table without bound.
MAX_BUCKETS = 10_000


class RateLimiter:
    """Token buckets, one per bearer token."""

    def __init__(self, rate: float = DEFAULT_RATE, burst: float = DEFAULT_BURST) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        # digest of the token -> (tokens left, when last refilled)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> RateLimiter | None:
        """The limiter CORRAL_WRITE_RATE and CORRAL_WRITE_BURST ask for; None when off."""
        rate = float(os.environ.get("CORRAL_WRITE_RATE", DEFAULT_RATE))
        burst = float(os.environ.get("CORRAL_WRITE_BURST", DEFAULT_BURST))
        return cls(rate, burst) if rate > 0 else None

    def take(self, token: str) -> float:
        """Spend one write of `token`'s bucket: 0 when allowed, else the seconds until the
        bucket has one again."""
        # The digest, not the token, so that this table holds no credentials.
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            left, then = self._buckets.get(key, (self.burst, now))
            left = min(self.burst, left + (now - then) * self.rate)
            if left < 1.0:
                self._buckets[key] = (left, now)
                return (1.0 - left) / self.rate
            self._buckets[key] = (left - 1.0, now)
            if len(self._buckets) > MAX_BUCKETS:
                self._prune(now)
            return 0.0

    def _prune(self, now: float) -> None:
        for key, (left, then) in list(self._buckets.items()):
            if left + (now - then) * self.rate >= self.burst:
                del self._buckets[key]


def retry_after(seconds: float) -> str:
    """A Retry-After value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
