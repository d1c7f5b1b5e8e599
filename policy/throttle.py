"""How fast compactd may act on the cluster: a token bucket and the retry backoff. Pure: time is passed in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    """`rate` actions per second with a burst of one second's worth; `take` answers whether one may go now."""

    rate: float
    tokens: float = -1.0
    at: float = 0.0

    def take(self, now_s: float) -> bool:
        burst = max(self.rate, 1.0)
        if self.tokens < 0:  # first use: a full bucket
            self.tokens, self.at = burst, now_s
        self.tokens = min(burst, self.tokens + (now_s - self.at) * self.rate)
        self.at = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait_s(self) -> float:
        """How long until the next token, after a refused `take`."""
        return max(0.0, (1.0 - self.tokens) / self.rate)


def backoff_ms(tries: int, base_ms: int, cap_ms: int) -> int:
    """Exponential backoff after the `tries`-th failed send: base, 2 x base, 4 x base, ... never above cap."""
    return min(cap_ms, base_ms * 2 ** min(max(tries - 1, 0), 40))
