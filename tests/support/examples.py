"""How many examples the fuzz and property tests of the unit suite generate.

`make test` runs each at a quarter of its nominal count (COMPACTD_FUZZ_SCALE=0.25 by default: the suite must stay within
minutes on 2 cores); `make soak` runs them at many times it.
"""

from __future__ import annotations

import os


def scale() -> float:
    return float(os.environ.get("COMPACTD_FUZZ_SCALE", "0.25"))


def examples(nominal: int) -> int:
    return max(10, round(nominal * scale()))


def seeds(nominal: int) -> range:
    """The seeds of a test run once per seed: `nominal` of them at a scale of 1, at least one."""
    return range(max(1, round(nominal * scale())))
