"""The warning of a call that runs unpacked reads as a sentence where no one
equation is at fault (an output with two axes along the example): it said
"'None' : an output with several axes along the example".
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import polyjit as pj

CASES = {
    "pairwise_output": (lambda x: x[:, None, 0] * x[None, :, 1],
                        "an output with several axes along the example"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_warning_names_no_missing_primitive(name):
  fun, why = CASES[name]
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in [5, 1, 9, 13]]
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = pj.vmap(fun)(packed)
  messages = [str(c.message) for c in caught if issubclass(c.category, pj.PerformanceWarning)]
  assert messages and "runs this packed batch unpacked" in messages[0]
  assert "'None'" not in messages[0], messages[0]
  if why is not None:
    assert why in messages[0]
  for got, x in zip(out.to_list(), xs, strict=True):   # (and still exact)
    np.testing.assert_allclose(got, fun(x), rtol=1e-6)
