"""Why does my code recompile? `pj.watch` on plain jax.jit code, `pj.explain` on pj.jit.

Run: .venv/bin/python examples/diagnostics.py (its output is in the README).
"""

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj


def loglik(x, mu):
  return jnp.sum(-0.5 * (x - mu) ** 2) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


rng = np.random.default_rng(0)
data = [rng.standard_normal(n).astype(np.float32) for n in rng.integers(100, 5000, 12)]

# Plain jax.jit: one compile per length. pj.watch says which argument and axis
# vary, and what pj.jit would compile instead.
fast = jax.jit(loglik)
with pj.watch() as report:
  for x in data:
    fast(x, 0.5)
print(report)
print()

# pj.jit: one compile per bucket; explain lists each compile and its cause.
bucketed = pj.jit(loglik)
for x in data:
  bucketed(x, 0.5)
print(pj.explain(bucketed))
