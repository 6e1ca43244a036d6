"""polyjit: one compiled program for every size.

`pj.mask` runs a function written for unpadded arrays on padded arrays and
returns the exact unpadded result, with logical sizes as runtime values.
See docs/DESIGN.md for the approach and the invariant.
"""

from . import buckets, diagnostics
from ._cache import disable_persistent_cache, enable_persistent_cache
from ._errors import (CacheWarning, CompileLimitError, FallbackWarning, MaskingError,
                      PolyjitError, PolyjitWarning, ShapeError, SizeValueError)
from ._filter_jit import FilterJitFunction, filter_jit
from ._jit import JitFunction, jit
from ._mask import Masked, mask
from ._padding import Padded
from ._ragged import Ragged
from ._ragged_groups import GroupedRagged, LengthGroups, vmap
from ._selection import boolean_mask, nonzero, unique
from ._size_range import SizeRangeError
from ._verify import VerificationError, verify
from .diagnostics import assert_max_compiles, explain, shapecheck, stats, watch

__version__ = "0.1.0"

__all__ = ["CacheWarning", "CompileLimitError", "FallbackWarning", "FilterJitFunction",
           "GroupedRagged", "JitFunction", "LengthGroups", "MaskingError", "Masked", "Padded",
           "PolyjitError", "PolyjitWarning", "Ragged", "ShapeError", "SizeRangeError",
           "SizeValueError", "VerificationError", "assert_max_compiles", "boolean_mask",
           "buckets", "diagnostics", "disable_persistent_cache", "enable_persistent_cache",
           "explain", "filter_jit", "jit", "mask", "nonzero", "shapecheck", "stats", "unique",
           "verify", "vmap", "watch"]
