"""A first look at pj.mask: one compiled program for every length."""

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj


def loglik(x, mu):  # written for an unpadded vector of any length
  return jnp.sum(-0.5 * (x - mu) ** 2) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


masked = jax.jit(pj.mask(loglik, ["n", None]))
lengths = (3, 7, 12, 16)
padded = []
for n in lengths:
  x = np.full(16, np.nan, np.float32)  # the padding may hold anything
  x[:n] = np.arange(n, dtype=np.float32)
  padded.append(x)

with pj.diagnostics.count_compiles() as compiles:
  results = [masked([x, 1.0], {"n": n}) for x, n in zip(padded, lengths)]

for n, got in zip(lengths, results):
  want = loglik(jnp.arange(n, dtype=jnp.float32), 1.0)
  print(f"n={n:2d}  masked={float(got):10.4f}  unpadded={float(want):10.4f}")
print(f"{len(lengths)} lengths, {len(compiles)} compile(s) of the masked function")
