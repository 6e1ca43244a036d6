"""Table rows for polyjit's own primitive of data-dependent sizes (`polyjit_compact`).

The harness checks them like every rule: NaN, inf and huge values in the
padding, eagerly, under jit, under vmap over logical sizes, and gradients.
The function-by-function reference tests are in tests/test_data_dependent.py.
"""

import jax.numpy as jnp

from harness import Case, make, normal, table_test

CASES = [
    Case("boolean mask x[x > 0]",
         lambda x: (x[x > 0] * 2, jnp.sum(x[x > 0] ** 2)), ["n"], make(normal("n"))),
    Case("unique with counts",
         lambda x: jnp.unique(jnp.round(x), return_counts=True), ["n"], make(normal("n")),
         modes=("eager", "jit", "vmap")),
]

CASES_BY_NAME, test_rule = table_test(CASES)
