"""Values whose forward-mode derivatives JAX computes and whose reverse mode it refuses.

An empty example's path (`empty.py`) that runs a `lax.while_loop` traces and
has a JVP, but JAX cannot transpose it: the program around it would fail in
reverse mode although the path is selected only where a size is 0. So the
path runs on its inputs under `stop_gradient` (its values exact) and
`with_forward_derivative` gives the values their derivative: in forward mode
(`jax.jvp`, `jax.jacfwd`) JAX's JVP of the path, computed by `forward_p`, a
primitive whose transpose sends NaN to the inputs where the outputs'
cotangents are not all 0 (`size_range.without_derivative` sends NaN for a
path without even a JVP): reverse mode over the whole program still works, an
empty example's reverse-mode derivatives are NaN, never a plausible number,
and a loss that leaves the empty example out gets the others' gradient. A second derivative of the
path is NaN too.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax as jc
from . import size_range as _size_range


class Tangents:
  """A function from `forward_p`'s operands (the path's inputs, its sizes,
  then `n_linear` tangents of its inexact inputs) to its float outputs'
  tangents. Hashed by identity (a primitive's parameter)."""

  def __init__(self, fn: Callable[..., list[Any]], n_linear: int):
    self.fn, self.n_linear = fn, n_linear


def path_tangents(run: Callable[..., Any], n_inputs: int, keys: Sequence[str],
                  inexact: Sequence[int], floats: Sequence[int]) -> Tangents:
  """The JVP of an empty path `run(xs, env)` (its outputs' `floats`) in its
  `inexact` inputs, as `forward_p` runs it."""
  def fn(*ops: Any) -> list[Any]:
    xs, ts = list(ops[:n_inputs]), list(ops[n_inputs + len(keys):])
    env = dict(zip(keys, ops[n_inputs:n_inputs + len(keys)], strict=True))

    def on(*values: Any) -> list[Any]:
      full = list(xs)
      for i, v in zip(inexact, values, strict=True):
        full[i] = v
      outs = run(full, env)[0]
      return [outs[i] for i in floats]
    return list(jax.jvp(on, [xs[i] for i in inexact], ts)[1])
  return Tangents(fn, len(inexact))


def _impl(*ops: Any, tangents: Tangents) -> list[Any]:
  return tangents.fn(*ops)


def _abstract(*ops: Any, tangents: Tangents) -> list[Any]:
  structs = [jc.shaped(np.shape(x), jc.typeof(x).dtype, False) for x in ops]
  outs = jax.eval_shape(tangents.fn, *structs)
  return [jc.shaped_array(o.shape, o.dtype) for o in outs]


def _jvp(primals: Any, tangents_in: Any, *, tangents: Tangents) -> tuple[list[Any], list[Any]]:
  # (a second derivative: NaN, linear in the tangents so that it transposes)
  outs = forward_p.bind(*primals, tangents=tangents)
  live = [t for t in tangents_in if not jc.is_zero_tangent(t)
          and jnp.issubdtype(jnp.result_type(t), jnp.inexact)]
  gate = np.float32(np.nan) * _size_range.tangent_total(live)
  return outs, [jnp.zeros_like(o) + gate.astype(o.dtype) for o in outs]


def _transpose(cts: Any, *ops: Any, tangents: Tangents) -> list[Any]:
  # the inputs' reverse-mode derivatives: NaN (JAX refuses this path's)
  # where the outputs' cotangents are not all 0, so that a loss that leaves
  # the empty example out has the other examples' gradient
  live = [c for c in cts if not jc.is_zero_tangent(c)]
  used = jnp.any(jnp.stack([jnp.any(c != 0) for c in live])) if live else jnp.bool_(False)
  head = len(ops) - tangents.n_linear
  return [None] * head + [
      jnp.where(used, jnp.full(t.aval.shape, np.nan, t.aval.dtype),
                jnp.zeros(t.aval.shape, t.aval.dtype)) if jc.is_undefined_primal(t) else None
      for t in ops[head:]]


def _batch(args: Any, dims: Any, *, tangents: Tangents) -> tuple[list[Any], list[int]]:
  # (bound again, batched: inlining the JVP would put the path's while_loop
  # in the program's derivative, which reverse mode then refuses)
  batched = Tangents(jax.vmap(tangents.fn, in_axes=tuple(dims)), tangents.n_linear)
  outs = forward_p.bind(*args, tangents=batched)
  return list(outs), [0] * len(outs)


forward_p = jc.ruled_primitive("polyjit_forward_only", _impl, _abstract, _jvp,
                               _transpose, _batch, multiple_results=True)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 4))
def with_forward_derivative(tangents: Tangents, outs: list[Any], xs: list[Any],
                            env: list[Any], inexact: tuple[int, ...]) -> list[Any]:
  """`outs` (the path's float outputs at `xs`, computed under stop_gradient)
  with JAX's forward-mode derivative of the path and NaN reverse-mode ones."""
  return list(outs)


@with_forward_derivative.defjvp
def _with_forward_derivative_jvp(tangents: Tangents, inexact: tuple[int, ...], primals: Any,
                                 tangents_in: Any) -> tuple[list[Any], list[Any]]:
  outs, xs, env = primals
  _, t_xs, _ = tangents_in
  touts = forward_p.bind(*xs, *env, *[t_xs[i] for i in inexact], tangents=tangents)
  return list(outs), list(touts)
