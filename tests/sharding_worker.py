"""Runs polyjit on 8 host devices and prints what tests/test_sharding.py checks.

Run in a subprocess (the flag below must be set before JAX starts, and the rest
of the suite keeps one device):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/sharding_worker.py

Every figure printed is a comparison with `jax.jit` or NumPy on the same
(unpadded) data, a compile count from `jax.monitoring`, or where the data
lives; the test decides what is right. One JSON object on the last line.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import polyjit as pj


def loglik(x, mu):
  return jnp.sum(-0.5 * (x - mu) ** 2) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def loglik64(x, mu):
  x = np.asarray(x, np.float64)
  return np.sum(-0.5 * (x - mu) ** 2) - 0.5 * x.shape[0] * np.log(2 * np.pi)


def rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(1e-6, float(np.max(np.abs(b)))))


def tree_rel(a, b) -> float:
  return max(rel(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def sharded_dynamic_axis(mesh) -> dict:
  """The seed likelihood with `x` split over 8 devices, lengths not multiples of 8."""
  s = NamedSharding(mesh, P("data"))
  f = pj.jit(loglik, in_shardings=(s, None), buckets=10)   # multiples of 10, rounded to 8
  sq = pj.jit(lambda x: (x - 0.5) ** 2, in_shardings=s, buckets=10)
  rng = np.random.default_rng(0)
  lengths = [1001, 1003, 997, 1013, 1019, 2005]
  errors, padded, devices, per_element = [], [], [], []
  with pj.diagnostics.count_compiles() as compiles:
    for n in lengths:
      x = rng.standard_normal(n).astype(np.float32)
      errors.append(rel(f(x, 0.3), loglik64(x, 0.3)))
      p = sq.call_padded(x)
      data = p.data if isinstance(p, pj.Padded) else p
      padded.append(int(data.shape[0]))
      devices.append(len(data.sharding.device_set))
      per_element.append(rel(sq(x), (x.astype(np.float64) - 0.5) ** 2))
  # A jax.Array already split over the mesh (125 per device) padded to a
  # bucket whose shard boundaries differ (data moves between shards).
  moved = []
  for n in (1000,):
    x = jax.device_put(rng.standard_normal(n).astype(np.float32), s)
    moved.append(rel(f(x, -0.2), loglik64(np.asarray(x), -0.2)))
  # A pj.Padded whose data is split over the mesh, into another pj.jit function.
  double = pj.jit(lambda x: 2 * x)
  x = rng.standard_normal(1003).astype(np.float32)
  chained = rel(double(sq.call_padded(x)), 2 * (x.astype(np.float64) - 0.5) ** 2)
  return {"lengths": lengths, "errors": errors, "padded": padded, "devices": devices,
          "per_element_errors": per_element, "moved_errors": moved, "chained_error": chained,
          "compiles": len(compiles)}


def training_step(mesh) -> dict:
  """A data-parallel step under pj.jit over a batch whose length changes."""
  s = NamedSharding(mesh, P("data"))
  rep = NamedSharding(mesh, P())

  def loss_and_preds(params, x, y):
    h = jnp.tanh(x @ params["w"])                         # (batch, length, hidden)
    preds = jnp.mean(h, axis=1) @ params["v"]             # (batch,)
    return jnp.mean((preds - y) ** 2), (preds, h)

  step = jax.value_and_grad(loss_and_preds, has_aux=True)
  rng = np.random.default_rng(1)
  params = jax.device_put({"w": rng.standard_normal((4, 8)).astype(np.float32) * 0.5,
                           "v": rng.standard_normal(8).astype(np.float32)}, rep)
  lengths = [20, 23, 37, 41, 29, 60]
  pj_step, jax_step = pj.jit(step), jax.jit(step)
  errors, devices, same_sharding = [], [], []
  pj_compiles = jax_compiles = 0
  for length in lengths:
    x = jax.device_put(rng.standard_normal((16, length, 4)).astype(np.float32), s)
    y = jax.device_put(rng.standard_normal(16).astype(np.float32), s)
    with pj.diagnostics.count_compiles() as c:
      got = pj_step(params, x, y)
    pj_compiles += len(c)
    with pj.diagnostics.count_compiles() as c:
      want = jax_step(params, x, y)
    jax_compiles += len(c)
    errors.append(tree_rel(got, want))
    for out, ref in zip(got[0][1], want[0][1]):   # per example; per token (unpadded)
      devices.append(len(out.sharding.device_set))
      same_sharding.append(bool(out.sharding.is_equivalent_to(ref.sharding, out.ndim)))
  return {"lengths": lengths, "errors": errors, "devices": devices,
          "same_sharding": same_sharding, "pj_compiles": pj_compiles,
          "jax_compiles": jax_compiles}


def ragged_vmap(mesh) -> dict:
  """pj.vmap over a sharded Ragged inside jax.jit, with gradients."""
  s = NamedSharding(mesh, P("data"))
  rng = np.random.default_rng(2)
  params = {"w": rng.standard_normal((3, 5)).astype(np.float32) * 0.5,
            "v": rng.standard_normal(5).astype(np.float32)}

  def per_example(params, x):                               # x: (length, 3)
    h = jnp.tanh(x @ params["w"])                           # a scan: the RNN case
    c, _ = jax.lax.scan(lambda c, ht: (jnp.tanh(0.5 * c + ht), None), jnp.zeros(5), h)
    return (jnp.mean(h @ params["v"]) + c @ params["v"]) ** 2

  def loss(params, batch):
    return pj.vmap(per_example, in_axes=(None, 0))(params, batch).mean()

  # The reference: each unpadded example through jax.jit, one program per
  # length (eager JAX differentiated the scan op by op at each length: that was
  # most of this worker's time).
  one = jax.jit(jax.value_and_grad(per_example))

  def reference(params, examples):
    values, grads = zip(*(one(params, x) for x in examples), strict=True)
    mean = lambda *leaves: sum(leaves) / len(examples)
    return mean(*values), jax.tree.map(mean, *grads)

  step = jax.jit(jax.value_and_grad(loss))
  errors, data_devices, out_devices, out_shapes = [], [], [], []
  compiles = 0
  for count, top in ((16, 40), (13, 70), (16, 33)):
    examples = [rng.standard_normal((int(n), 3)).astype(np.float32)
                for n in rng.integers(1, top, size=count)]
    batch = pj.Ragged.from_list(examples, sharding=s,
                                batch_buckets=None if count == 16 else 8)
    with pj.diagnostics.count_compiles() as c:
      got = step(params, batch)
    compiles += len(c)
    want = reference(params, examples)
    errors.append(tree_rel(got, want))
    data_devices.append(len(batch.data.sharding.device_set))
    outs = pj.vmap(per_example, in_axes=(None, 0))(params, batch)   # its own jax.jit
    outs = outs.data if isinstance(outs, pj.Ragged) else outs
    out_devices.append(len(outs.sharding.device_set))
    out_shapes.append(list(outs.shape))
  return {"errors": errors, "data_devices": data_devices, "out_devices": out_devices,
          "out_shapes": out_shapes, "compiles": compiles}


def main() -> None:
  assert jax.device_count() == 8, jax.devices()
  mesh = jax.make_mesh((8,), ("data",))
  out = {"sharded_dynamic_axis": sharded_dynamic_axis(mesh),
         "training_step": training_step(mesh),
         "ragged_vmap": ragged_vmap(mesh)}
  print(json.dumps(out))
  sys.stdout.flush()


if __name__ == "__main__":
  main()
