"""A fresh process for tests/test_disk_cache.py: runs `pj.jit` on given sizes
with polyjit's default on-disk cache (its directory from POLYJIT_CACHE_DIR),
and prints, as one JSON object on the last line, the compiles and cache loads
measured with jax.monitoring, the results, and polyjit's warnings.

    POLYJIT_CACHE_DIR=... python tests/disk_cache_worker.py <body> <size,size,...>
"""

from __future__ import annotations

import json
import sys
import warnings

import jax.numpy as jnp
import numpy as np

import polyjit as pj

BODIES = {
    "square": lambda x: jnp.sum(x * x),
    "cube": lambda x: jnp.sum(x * x * x),
}


def ragged_main(sizes) -> None:
  """`pj.vmap` over a `pj.Ragged` batch inside `jax.jit` (programs compiled by JAX)."""
  import jax
  step = jax.jit(pj.vmap(lambda x: jnp.sum(x * x)))
  data = np.arange(1, max(sizes) + 1, dtype=np.float32) / max(sizes)
  batches = [sizes[i:i + 2] for i in range(0, len(sizes), 2)]
  with pj.diagnostics.count_compiles() as log:
    results = [[float(v) for v in step(pj.Ragged.from_list([data[:n] for n in b]))]
               for b in batches]
  expected = [[float(np.sum(data[:n].astype(np.float64) ** 2)) for n in b] for b in batches]
  print(json.dumps({"compiles": len(log), "loads": len(log.cache_loads),
                    "results": sum(results, []), "expected": sum(expected, []),
                    "warnings": []}))


def main() -> None:
  if sys.argv[1] == "ragged":
    return ragged_main([int(s) for s in sys.argv[2].split(",")])
  body, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
  fun = BODIES[body]

  def loss(x):  # one name for every body: only the traced program tells them apart
    return fun(x)

  f = pj.jit(loss)
  ran = _count_probes()
  data = np.arange(1, max(sizes) + 1, dtype=np.float32) / max(sizes)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with pj.diagnostics.count_compiles() as log:
      results = [float(f(data[:n])) for n in sizes]
  expected = [float(np.sum(data[:n].astype(np.float64) ** (2 if body == "square" else 3)))
              for n in sizes]
  print(json.dumps({
      "compiles": len(log), "loads": len(log.cache_loads), "results": results,
      "expected": expected,
      # why each program was built or loaded ("first call": automatic mode's exact one)
      "causes": [e.cause.kind for e in f.stats.compile_events],
      "warnings": [str(w.message) for w in caught if issubclass(w.category, pj.PolyjitWarning)],
      # the JAX probes that ran during the calls (`_caching/probe_memo.py`)
      "probes_run": ran,
  }))


def _count_probes() -> list[str]:
  """The names of the registry's probes that run from here on, as they run."""
  import dataclasses

  from polyjit._jax import registry
  ran: list[str] = []
  for name, row in list(registry.ROWS.items()):
    def probe(run=row.probe, name=name):
      ran.append(name)
      run()
    registry.ROWS[name] = dataclasses.replace(row, probe=probe)
  return ran


if __name__ == "__main__":
  main()
