"""`_masking`'s traces need the exact replacements `_spellings` registers on
import (`polyjit/__init__.py` imports it first, by name). A trace without them
is refused with a message naming the cause, never traced without them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._jax import swaps


def test_a_trace_without_the_registered_replacements_is_refused(monkeypatch):
  monkeypatch.setattr(swaps, "_spelling_replacements", {})
  with pytest.raises(swaps.SpellingsNotRegistered, match="polyjit._spellings"):
    pj.mask(lambda x: jnp.sum(x), ["n"])([np.ones(4, np.float32)], {"n": 3})


def test_importing_polyjit_registers_every_replacement():
  assert len(swaps.site_plan()) == len(swaps.SWAP_SITES)
