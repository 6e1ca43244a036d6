"""XLA:CPU's thread-pool hand-off: the seed log-likelihood's compiled program per call at
several sizes, with JAX's asynchronous CPU dispatch (the default) or without it.

XLA:CPU runs a program whose cost analysis counts under about 1000 flops on the
calling thread and hands any other to its thread pool; that hand-off is a fixed
cost per call that no bucket choice removes. `jax_cpu_enable_async_dispatch`
is read when JAX's CPU client starts, so each setting runs in its own process:

    python benchmarks/cpu_dispatch.py          # both, one process each
    python benchmarks/cpu_dispatch.py --sync   # this process, dispatch off
"""

from __future__ import annotations

import subprocess
import sys
import time

SIZES = (128, 512, 1024, 2048, 4096, 6144, 8192, 16384, 32768)


def measure(sync: bool) -> str:
  import jax
  if sync:
    jax.config.update("jax_cpu_enable_async_dispatch", False)
  import jax.numpy as jnp
  import numpy as np

  def loglik(x, mu, log_sigma):
    z = (x - mu) * jnp.exp(-log_sigma)
    return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)
  mu, ls = np.float32(0.1), np.float32(0.3)
  progs = {}
  for n in SIZES:
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    progs[n] = (jax.jit(loglik).lower(x, mu, ls).compile(), x)
  times: dict[int, list[float]] = {n: [] for n in SIZES}
  for _ in range(5):  # sizes interleaved, medians kept
    for n, (p, x) in progs.items():
      t = time.perf_counter()
      for _ in range(500):
        float(p(x, mu, ls))
      times[n].append((time.perf_counter() - t) / 500 * 1e6)
  label = "sync (async dispatch off)" if sync else "async (default)"
  return label + ": " + "  ".join(f"{n}: {np.median(v):.0f} us" for n, v in times.items())


def main() -> None:
  if "--sync" in sys.argv or "--async" in sys.argv:
    print(measure("--sync" in sys.argv))
    return
  for flag in ("--async", "--sync"):
    out = subprocess.run([sys.executable, __file__, flag], capture_output=True, text=True)
    print(out.stdout.strip() or out.stderr.strip().splitlines()[-1])


if __name__ == "__main__":
  main()
