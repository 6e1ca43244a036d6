"""Exact replacements for JAX spellings that JAX cannot trace at symbolic sizes.

`replacements` swaps in versions of `jnp.searchsorted`, `jnp.interp` and the like while
a function is traced for masking; `data_dependent` the selections (`x[x > 0]`,
`jnp.nonzero`, `jnp.unique`) with a size the program computes; `selection` holds
`pj.nonzero`, `pj.boolean_mask` and `pj.unique`. Importing the package registers the
replacements with `_jax.register_spellings`; `_masking.trace.trace_flat` imports it
before its first trace, so no import order is relied on.
"""
from . import along_axis, data_dependent, indices, length, replacements, scans, signal  # noqa: F401  (register the replacements used while tracing)
