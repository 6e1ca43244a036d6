"""Masking rules, one module per primitive family.

Importing this package fills `polyjit._core.masking_rules`. Each module's
docstring says why its family needs the rules it has.
"""

from . import (  # noqa: F401  (imported to register the rules)
    contractions,
    control_flow,
    elementwise,
    indexing,
    layout,
    reductions,
    structural,
)
