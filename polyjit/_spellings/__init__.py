"""Exact replacements for JAX spellings that JAX cannot trace at symbolic sizes.

`replacements` swaps in versions of `jnp.searchsorted`, `jnp.interp` and the like while
a function is traced for masking; `selection` holds `pj.nonzero`, `pj.boolean_mask` and
`pj.unique`. Importing the package registers the replacements (`polyjit/__init__.py`
does, by re-exporting the selections).
"""
from . import data_dependent, replacements, signal  # noqa: F401  (register the replacements used while tracing)
