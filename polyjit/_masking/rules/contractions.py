"""Contractions: zero the padding of contracted dynamic axes, on both operands.

`dot_general` sums products over its contracting axes. Zeroing one operand's
padding is not enough, since 0 * NaN = NaN: both operands get zeros in the
padding of every dynamic contracting axis. Batch and free axes need nothing
(their padding lands in the padding of the result), but an operand that is
masked gets zeros in all its padding: then a value contracted along one axis
here and along another elsewhere (attention's gradients) is masked once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import RuleContext, register


@register("dot_general")
def _dot_general(ctx: RuleContext, lhs: Any, rhs: Any, *, dimension_numbers: Any,
                 **params: Any) -> list[Any]:
  (lhs_contract, rhs_contract), _ = dimension_numbers
  lhs_aval, rhs_aval = ctx.in_avals
  lhs = ctx.fill_padding_if(lhs, lhs_aval, np.zeros((), lhs.dtype)[()], lhs_contract)
  rhs = ctx.fill_padding_if(rhs, rhs_aval, np.zeros((), rhs.dtype)[()], rhs_contract)
  return ctx.bind(lhs, rhs, dimension_numbers=dimension_numbers, **params)
