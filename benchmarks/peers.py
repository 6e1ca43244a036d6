"""The seed log-likelihood written for each peer, as `fn(x, mu, log_sigma) -> float`.

Peers are optional (`pip install -e ".[peers]"`): a missing one is reported
with the reason and skipped. Each peer runs the same computation in float32
and returns a Python float, so results compare directly.
"""

from __future__ import annotations

import math
import os
from typing import Callable


def jax_export() -> Callable:
  """`jax.export` with a symbolic length: one serialized artifact, and
  `Exported.call` on each concrete shape."""
  import jax
  import jax.numpy as jnp
  from jax import export

  def loglik(x, mu, log_sigma):
    z = (x - mu) * jnp.exp(-log_sigma)
    return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)

  n, = export.symbolic_shape("n")
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  exported = export.export(jax.jit(loglik))(jax.ShapeDtypeStruct((n,), jnp.float32),
                                            scalar, scalar)
  return lambda x, mu, ls: float(exported.call(x, mu, ls))


def fresh_inductor(torch) -> None:
  """Each torch contender compiles from nothing, like jax.jit does: no reuse of
  Inductor's graph cache (in memory or on disk) from the other contender or an
  earlier run. Inductor's one-time start-up (imports, its compile workers) is
  paid here, outside the timing, as JAX's backend start-up is."""
  torch._inductor.config.fx_graph_cache = False
  torch._inductor.config.fx_graph_remote_cache = False
  torch._inductor.config.autotune_local_cache = False
  torch._dynamo.reset()
  torch.compile(lambda t: t * 2 + 1)(torch.ones(3))
  torch._dynamo.reset()


def torch_compile(dynamic: bool | None) -> Callable | str:
  """`torch.compile`: default mode (automatic dynamic shapes: static first,
  dynamic after a recompile) or `dynamic=True`."""
  try:
    import torch
  except ImportError as e:
    return f"torch is not installed ({e}); pip install torch==2.13.0"
  torch.set_num_threads(max(1, os.cpu_count() or 1))

  def loglik(x, mu, log_sigma):
    z = (x - mu) * torch.exp(-log_sigma)
    return torch.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * math.log(2 * math.pi)

  fresh_inductor(torch)
  compiled = torch.compile(loglik, dynamic=dynamic)

  def call(x, mu, ls):
    with torch.no_grad():
      return float(compiled(torch.from_numpy(x), torch.tensor(mu), torch.tensor(ls)))
  return call


def tf_function() -> Callable | str:
  """`tf.function(reduce_retracing=True)`: retraces with a generalized shape."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  try:
    import tensorflow as tf
  except ImportError as e:
    return f"tensorflow is not installed ({e}); pip install tensorflow-cpu"

  @tf.function(reduce_retracing=True, jit_compile=False)
  def loglik(x, mu, log_sigma):
    z = (x - mu) * tf.exp(-log_sigma)
    n = tf.cast(tf.shape(x)[0], tf.float32)
    return tf.reduce_sum(-0.5 * z * z - log_sigma) - 0.5 * n * math.log(2 * math.pi)

  return lambda x, mu, ls: float(loglik(tf.constant(x), tf.constant(mu), tf.constant(ls)))


def tf_traces(fn) -> int | None:
  """How many concrete functions a tf.function traced (its 'compiles')."""
  inner = getattr(fn, "__closure__", None)
  if not inner:
    return None
  for cell in inner:
    f = cell.cell_contents
    if hasattr(f, "experimental_get_tracing_count"):
      return f.experimental_get_tracing_count()
  return None


def torch_compiles() -> int | None:
  """Graphs torch.compile (dynamo) compiled since the last reset."""
  try:
    from torch._dynamo.utils import counters
  except ImportError:
    return None
  return int(sum(counters["stats"].get(k, 0) for k in ("unique_graphs",)))


PEERS = {
    "jax.export (symbolic)": lambda: jax_export(),
    "torch.compile (default)": lambda: torch_compile(None),
    "torch.compile (dynamic=True)": lambda: torch_compile(True),
    "tf.function (reduce_retracing)": lambda: tf_function(),
}
