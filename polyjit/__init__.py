"""polyjit: one compiled program for every size.

`pj.mask` runs a function written for unpadded arrays on padded arrays and
returns the exact unpadded result, with logical sizes as runtime values.
See docs/DESIGN.md for the approach and the invariant.
"""

# First, by name: importing `_spellings` registers the exact replacements of JAX
# spellings that every symbolic trace (`_masking.trace`) needs; `_masking` cannot
# import it (it builds on `_masking`), and a trace refuses to run without them.
from . import _spellings  # noqa: F401
from . import buckets, diagnostics
from ._caching.executables import disable_persistent_cache, enable_persistent_cache
from ._masking.errors import (CacheWarning, CompileLimitError, FallbackWarning, MaskingError,
                              PerformanceWarning, PolyjitError, PolyjitWarning, ShapeError,
                              SizeValueError)
from ._jit.filter_jit import FilterJitFunction, filter_jit
from ._jit.function import JitFunction, jit
from ._masking.mask import Masked, mask
from ._masking.padding import Padded
from ._ragged.ragged import Ragged
from ._ragged.packing import PackedRagged, Packing
from ._ragged.groups import GroupedRagged, LengthGroups, vmap
from ._spellings.selection import boolean_mask, nonzero, unique
from ._masking.size_range import SizeRangeError
from ._masking.verify import VerificationError, verify
from .diagnostics import assert_max_compiles, explain, shapecheck, stats, watch

__version__ = "0.1.0"

__all__ = ["CacheWarning", "CompileLimitError", "FallbackWarning", "FilterJitFunction",
           "GroupedRagged", "JitFunction", "LengthGroups", "MaskingError", "Masked", "PackedRagged", "Packing", "Padded",
           "PerformanceWarning", "PolyjitError", "PolyjitWarning", "Ragged", "ShapeError", "SizeRangeError",
           "SizeValueError", "VerificationError", "assert_max_compiles", "boolean_mask",
           "buckets", "diagnostics", "disable_persistent_cache", "enable_persistent_cache",
           "explain", "filter_jit", "jit", "mask", "nonzero", "shapecheck", "stats", "unique",
           "verify", "vmap", "watch"]
