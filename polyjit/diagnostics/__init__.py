"""Compile statistics, explanations and guards.

Compile counts are measured with `jax.monitoring`, never assumed
(`count_compiles`). For `pj.jit` functions: `stats` and `explain`; for plain
`jax.jit` code: `watch`; for tests and serving: `assert_max_compiles`; before
running anything: `shapecheck`.
"""

from .._caching.compiles import CompileEvent, CompileLog, count_compiles
from ._explain import JitStats, explain, stats
from ._guard import assert_max_compiles
from ._shapecheck import shapecheck
from ._watch import FunctionReport, WatchReport, watch

__all__ = ["CompileEvent", "CompileLog", "FunctionReport", "JitStats", "WatchReport",
           "assert_max_compiles", "count_compiles", "explain", "shapecheck", "stats", "watch"]
