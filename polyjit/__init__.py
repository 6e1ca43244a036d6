"""polyjit: one compiled program for every size.

`pj.mask` runs a function written for unpadded arrays on padded arrays and
returns the exact unpadded result, with logical sizes as runtime values.
See DESIGN.md for the approach and the invariant.
"""

from . import buckets, diagnostics
from ._errors import MaskingError, PolyjitError, ShapeError
from ._mask import Masked, mask

__version__ = "0.1.0"

__all__ = ["MaskingError", "Masked", "PolyjitError", "ShapeError", "buckets", "diagnostics",
           "mask"]
