"""Compile statistics, explanations and guards.

`count_compiles()` records every XLA backend compile in a block of code, as
`jax.monitoring` reports it: compile counts are measured, never assumed.
"""

from ._compiles import CompileEvent, CompileLog, count_compiles

__all__ = ["CompileEvent", "CompileLog", "count_compiles"]
