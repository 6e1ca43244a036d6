"""One of two real processes of a `jax.distributed` run (tests/test_sharding.py).

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
      python tests/multiprocess_worker.py <process_id> <port>

Each process owns half of the examples (process 0 the shorter ones, so the
local maxima differ), builds the global batch with `pj.Ragged.from_process_local`
and computes the loss and gradients data-parallel over the 4 devices of both
processes, under `jax.jit` and under `pj.jit`. It prints them, with what one
process computes on all examples, as one JSON object on the last line.
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

NUM_PROCESSES = 2


def per_example(params, x):                                 # x: (length, 3)
  return jnp.mean(jnp.tanh(x @ params["w"]) @ params["v"]) ** 2


def loss(params, batch):
  return pj.vmap(per_example, in_axes=(None, 0))(params, batch).mean()


def reference(params, examples):
  return sum(per_example(params, x) for x in examples) / len(examples)


def local_value(x) -> list:
  """A replicated global array's value, read from this process's first shard."""
  return np.asarray(x.addressable_shards[0].data, np.float64).ravel().tolist()


def main() -> None:
  process_id, port = int(sys.argv[1]), int(sys.argv[2])
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=NUM_PROCESSES,
                             process_id=process_id, initialization_timeout=60)
  try:
    rng = np.random.default_rng(0)
    lengths = np.sort(rng.integers(3, 60, size=8))
    examples = [rng.standard_normal((int(n), 3)).astype(np.float32) for n in lengths]
    params = {"w": rng.standard_normal((3, 5)).astype(np.float32) * 0.5,
              "v": rng.standard_normal(5).astype(np.float32)}
    mine = examples[4 * process_id: 4 * (process_id + 1)]
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    batch = pj.Ragged.from_process_local(mine, NamedSharding(mesh, P("data")))
    value, grads = jax.jit(jax.value_and_grad(loss))(params, batch)
    pj_value, pj_grads = pj.jit(jax.value_and_grad(loss))(params, batch)
    ref_value, ref_grads = jax.value_and_grad(reference)(params, examples)
    out = {
        "process": process_id,
        "devices": jax.device_count(), "local_devices": jax.local_device_count(),
        "local_max": int(max(x.shape[0] for x in mine)),
        "padded": int(batch.padded_lengths[0]), "batch": int(batch.batch_size),
        "loss": local_value(value), "grads": [local_value(g) for g in jax.tree.leaves(grads)],
        "pj_loss": local_value(pj_value),
        "pj_grads": [local_value(g) for g in jax.tree.leaves(pj_grads)],
        "ref_loss": [float(ref_value)],
        "ref_grads": [np.asarray(g, np.float64).ravel().tolist()
                      for g in jax.tree.leaves(ref_grads)],
    }
    print(json.dumps(out))
    sys.stdout.flush()
  finally:
    jax.distributed.shutdown()


if __name__ == "__main__":
  main()
