"""What a fresh symbolic scope per trace costs (issue 22 §1, issue 25).

No JAX trace cache (a `jax.jit` helper, `lax.scan`/`cond` bodies,
`jax.checkpoint`, jnp's own jitted helpers) may carry a size decision from one
trace into another. Issue 22 gave every trace a fresh scope, so those caches
missed once per trace; now a trace borrows a shared scope and leaves it at its
first size question (`_masking/scopes.py`), so a function that asks none
meets JAX's caches warm. This measures the symbolic trace of a function
(`pj.mask(...).variants`, what `pj.jit` does before its first masked compile),
shared scope against a fresh one (what a function that asks gets),
interleaved, on the seed log-likelihood and on a Flax transformer block
(attention + MLP, `flax.linen`):

    .venv/bin/python benchmarks/trace_scope.py [--repeats 20]

Prints the median milliseconds per trace for each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj


def seed(x, mu):
  return jnp.sum(-0.5 * (x - mu) ** 2) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def flax_block():
  import flax.linen as nn

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.LayerNorm()(x)
      h = nn.SelfAttention(num_heads=4, qkv_features=32)(h)
      x = x + h
      h = nn.Dense(64)(nn.LayerNorm()(x))
      return x + nn.Dense(32)(nn.gelu(h))

  block = Block()
  params = block.init(jax.random.key(0), jnp.ones((5, 32)))
  return (lambda x, p: block.apply(p, x)), (np.ones((16, 32), np.float32), params), ["(n, _)", None]


def trace_ms(fun, args, specs, fresh: bool) -> float:
  masked = pj.mask(fun, specs)   # a new function: nothing of polyjit's is cached
  masked._asks_sizes = fresh     # (as if it had asked a size question: fresh scopes)
  t0 = time.perf_counter()
  masked.variants(list(args))
  return (time.perf_counter() - t0) * 1e3


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=20)
  a = parser.parse_args()
  rows = {"seed log-likelihood": (seed, (np.ones(16, np.float32), np.float32(0.5)), ["n", None])}
  try:
    fun, args, specs = flax_block()
    rows["Flax transformer block"] = (fun, args, specs)
  except ImportError:
    print("(flax not installed: the block is skipped)")
  for name, (fun, args, specs) in rows.items():
    for fresh in (False, True):  # warm JAX's own caches once
      trace_ms(fun, args, specs, fresh)
    times = {False: [], True: []}
    for _ in range(a.repeats):
      for fresh in (False, True):
        times[fresh].append(trace_ms(fun, args, specs, fresh))
    shared, own = statistics.median(times[False]), statistics.median(times[True])
    print(f"{name:24s} shared scope {shared:7.2f} ms  fresh scope {own:7.2f} ms  "
          f"ratio {own / shared:4.2f}x  ({a.repeats} interleaved repeats)")


if __name__ == "__main__":
  main()
