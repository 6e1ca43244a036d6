"""Sharded arguments: padding that keeps each array on its mesh.

One module, `placement`, whose docstring is the design: a structure's per-leaf
shardings (None: one device) take one path for compiling, padding and
unpadding; which sharding an argument has (`pj.jit(in_shardings=...)` wins, else a
multi-device array keeps its own); buckets on a sharded axis rounded up to a
multiple of its shard count (`dim_multiples`); padding built shard by shard
(`jax.make_array_from_callback`), never gathered; `Explicit` mesh axes compiled
as `Auto` and relabelled; and, across processes, every new program agreed on
(`agree_on_program`) and ragged batches built from process-local examples
(`agree_on_batch`, `put_batch`).
"""
