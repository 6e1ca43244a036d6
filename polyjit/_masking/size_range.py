"""Traced logical sizes outside `[0, padded]`: never a plausible number.

A traced size comes from the user's own program (`jax.jit(pj.mask(f))`, a
`pj.Ragged` built inside `jax.jit`, `jax.vmap` over sizes), where nothing can
raise at run time. A size below 0 or above its padded size has no unpadded
computation to match, nor has an empty size whose own trace fails (JAX
refuses `jnp.max` of an empty array; `_masking/empty.py`), nor, for a
function that creates data-dependent sizes (or a path that only runs where
its sizes are >= 1), a size of 0, so such a call's outputs are *poisoned* instead of
computed on garbage: NaN in floating and complex dtypes, the dtype's minimum
in signed integers, its maximum in unsigned ones, False in bools (the values
the pj.mask and Ragged guides document), the key data's maximum in typed
PRNG keys, and the logical shapes a data-dependent function returns (its
counts) the int32 minimum. So are the outputs of a call whose traced sizes
violate a declared constraint (`constraints=["n >= 3"]`), where jax.jit of
the function raises at those shapes. The poison reaches derivatives too: a
select alone would give a poisoned output a derivative of 0 (its transpose
drops the cotangent of the branch not taken), and under `jax.vmap` such an
example would silently drop out of a batch loss's gradient. So a poisoned
output's tangent is NaN, and so is the cotangent it sends to each of the
call's inexact inputs, whatever the masked evaluation makes of it (with a
size of -1 every valid mask is empty, and nothing would reach them);
where the sizes keep the contract the derivatives are exact (times 1, plus
-0.0, which keeps the sign of a zero tangent: `_poisoned_outputs`; a cotangent of
-0.0 still comes back as 0, as the `lax.switch` over variants and empty paths
gives each input it does not use a 0 too). Under the checking mode
(`POLYJIT_VERIFY=1` or `pj.verify(True)`, `_masking/verify.py`) the call raises
`pj.SizeRangeError` instead, from a host callback.

Concrete sizes never get here: `_masking.spec.logical_values` refuses them with the
size and the bound.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from . import dims as _dims, verify as _verify
from .errors import ShapeError
from .padding import is_key_dtype


class SizeRangeError(ShapeError):
  """A traced logical size was outside `[0, padded size]` (checking mode)."""


def poison_value(dtype: Any) -> Any:
  """What an output of a call with out-of-range sizes holds."""
  if is_key_dtype(dtype):
    return None   # typed keys: nothing to poison
  dtype = np.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.inexact):
    return np.array(np.nan, dtype)
  if dtype == np.bool_:
    return np.array(False)
  if jnp.issubdtype(dtype, jnp.integer):
    info = np.iinfo(dtype)
    return np.array(info.min if info.min < 0 else info.max, dtype)
  return None   # (typed keys, float0: nothing to poison)


def in_range(env: Mapping[str, Any], padded: Mapping[str, int], lowest: int = 1) -> Any:
  """Whether every size of `env` lies in [lowest, padded] (a traced bool).

  In lax, not jnp: this runs in every masked trace with traced sizes, and each
  jnp operator costs a jitted helper's dispatch there (the same comparisons).
  """
  ok: Any = None
  for name, value in env.items():
    dtype = np.dtype(value.dtype)
    here = lax.bitwise_and(lax.ge(value, np.asarray(lowest, dtype)),
                           lax.le(value, np.asarray(padded[name], dtype)))
    ok = here if ok is None else lax.bitwise_and(ok, here)
  return jnp.bool_(True) if ok is None else ok


def _poisoned(o: Any, ok: Any, bad: Any) -> Any:
  """`jnp.where(ok, o, bad)` for a scalar `ok` and a poison `bad` of `o`'s
  dtype, in lax: the poison is not weakly typed, so neither is the result."""
  if jc.typeof(o).weak_type:
    o = lax.convert_element_type(o, o.dtype)   # (weak_type=False)
  shape = np.shape(o)
  pred = lax.broadcast_in_dim(ok, shape, ()) if shape else ok
  return lax.select(pred, o, lax.full_like(o, bad))


#: The key, in the sizes a data-dependent call returns, of whether traced
#: sizes kept the contract: `logical_shapes` (below) poisons the
#: counts where they did not.
IN_CONTRACT = "(in contract)"


def constraints_hold(env: Mapping[str, Any], scope: jc.SymbolicScope | None) -> Any:
  """Whether (traced) sizes satisfy the declared constraints of `scope`
  (`constraints=["n >= 3"]`): a traced bool; True without constraints."""
  ok: Any = jnp.bool_(True)
  if scope is None:
    return ok
  for _, kind, diff in jc.scope_constraints(scope):
    if not _dims.dim_vars(diff) <= set(env):
      continue   # (a constraint on a data-dependent size: checked where it is made)
    value = _dims.evaluate_dim(diff, dict(env))
    ok = ok & ((value == 0) if kind == "eq" else (value >= 0))
  return ok


def guard(outs: Sequence[Any], env: Mapping[str, Any], padded: Mapping[str, int],
          what: str, scope: jc.SymbolicScope | None = None, *, lowest: int = 1,
          ok: Any = None, inputs: Sequence[Any] = ()) -> tuple[list[Any], Any]:
  """(`outs`, poisoned where a size of `env` is outside [lowest, padded], `ok`
  is False (a path that has no computation at these sizes) or a declared
  constraint of `scope` is violated; the traced bool that says they are not).
  Their derivatives, with respect to the call's `inputs` too, are poisoned
  with them. Checking, the call raises instead."""
  if not env:
    return list(outs), jnp.bool_(True)
  in_bounds = in_range(env, padded, lowest)
  if ok is not None:
    in_bounds = lax.bitwise_and(in_bounds, ok)
  declared = constraints_hold(env, scope)
  ok = lax.bitwise_and(in_bounds, declared)
  if _verify.enabled():
    names = sorted(env)
    constraints = tuple(text for text, _, _ in jc.scope_constraints(scope)) if scope else ()
    jax.debug.callback(_raise_if_out_of_range, in_bounds, declared, [env[k] for k in names],
                       names=tuple(names), padded=tuple(padded[k] for k in names), what=what,
                       constraints=constraints)
  return poison(outs, ok, inputs), ok


def poison(outs: Sequence[Any], ok: Any, inputs: Sequence[Any] = ()) -> list[Any]:
  """Each of `outs` where `ok` (a traced bool), its poison elsewhere; typed
  PRNG keys get the unsigned poison in their key data (a key that no seed
  gives by chance is not possible, but one every failed call shares is).
  Where not `ok`, the inexact outputs' derivatives, with respect to the
  call's `inputs` too, are NaN (`_poisoned_outputs`)."""
  guarded: list[Any] = []
  floats, indices = [], []
  for o in outs:
    if hasattr(o, "dtype") and is_key_dtype(o.dtype):
      data = jax.random.key_data(o)
      data = _poisoned(data, ok, poison_value(data.dtype))
      guarded.append(jax.random.wrap_key_data(data, impl=jax.random.key_impl(o)))
      continue
    bad = poison_value(o.dtype) if hasattr(o, "dtype") else None
    if bad is not None and _inexact(o) and isinstance(o, jc.Tracer):
      indices.append(len(guarded))
      floats.append(o)
    guarded.append(o if bad is None else _poisoned(o, ok, bad))
  if floats:
    # (only traced values can have a derivative; a NumPy constant, also one
    # that jax.vmap holds as a batched value, is no argument for a
    # jax.custom_jvp: copied, it is a JAX value, and the copy is unused but
    # by the derivative)
    differentiable = [jnp.array(x, copy=True) for x in inputs
                      if _inexact(x) and isinstance(x, jc.Tracer)]
    for i, y in zip(indices, _poisoned_outputs(ok, floats, differentiable), strict=True):
      guarded[i] = y
  return guarded


def _inexact(x: Any) -> bool:
  return hasattr(x, "dtype") and not is_key_dtype(x.dtype) and bool(
      jnp.issubdtype(x.dtype, jnp.inexact))


@jax.custom_jvp
def _poisoned_outputs(ok: Any, outs: list[Any], inputs: list[Any]) -> list[Any]:
  """`outs` where `ok`, NaN elsewhere (values as `_poisoned`); where not `ok`
  their tangents are NaN, and so are the cotangents they send to `outs` and
  to `inputs` (the call's own inputs: a select in the masked evaluation, or
  a valid mask that is empty at a size of -1, would drop them on the way)."""
  return [_poisoned(o, ok, poison_value(o.dtype)) for o in outs]


@_poisoned_outputs.defjvp
def _poisoned_outputs_jvp(primals: Any, tangents: Any) -> tuple[list[Any], list[Any]]:
  ok, outs, inputs = primals
  _, t_outs, t_inputs = tangents
  # Linear in the tangents and exact where `ok`: times 1, plus a term that a
  # select makes -0.0 there, whatever the tangents hold (inf, NaN) and in both
  # directions (0 * inf would be NaN: the NaN factor multiplies after the
  # select going forward, before it going back). -0.0, not 0: x + -0.0 is x for
  # every x, where x + 0 turned a tangent of -0.0 into 0 (jax.jit keeps its
  # sign); no select on the outputs' tangents, so the same one fused pass.
  # Going back, the select sends the inputs 0 where `ok` (the zero JAX gives an
  # input that no output depends on; a select sending -0.0 would give such an
  # input -0.0).
  one = lax.select(ok, np.float32(1), np.float32(np.nan))
  zero = lax.select(ok, np.float32(0), np.float32(np.nan))
  total = tangent_total(t_inputs)
  gate = zero * lax.select(ok, lax.full_like(total, -0.0), total)
  out_tangents = []
  for t in t_outs:
    # (the real dtype of a complex one)
    real = jnp.finfo(t.dtype).dtype  # type: ignore[no-untyped-call, unused-ignore]
    scaled = _scaled(t, _as(one, real))
    out_tangents.append(_added_to_real(scaled, _as(gate, real)))
  return _poisoned_outputs(ok, outs, inputs), out_tangents


@jax.custom_jvp
def without_derivative(outs: list[Any], inputs: list[Any]) -> list[Any]:
  """`outs` as they are, their derivative with respect to `inputs` NaN: for
  values JAX computes but cannot differentiate (an empty path whose VJP JAX
  refuses, `empty.py`), where a derivative is asked for. `outs` must not
  depend on `inputs` through JAX (computed from them under stop_gradient)."""
  return list(outs)


@without_derivative.defjvp
def _without_derivative_jvp(primals: Any, tangents: Any) -> tuple[list[Any], list[Any]]:
  outs, inputs = primals
  t_outs, t_inputs = tangents
  # NaN times the inputs' tangents: linear, so reverse mode transposes it and
  # sends the inputs NaN, whatever the tangents hold (0 * NaN is NaN)
  gate = np.float32(np.nan) * tangent_total(t_inputs)
  out_tangents = []
  for o, t in zip(outs, t_outs, strict=True):
    real = jnp.finfo(o.dtype).dtype  # type: ignore[no-untyped-call, unused-ignore]
    out_tangents.append(_added_to_real(t, _as(gate, real)))
  return list(outs), out_tangents


def _as(x: Any, dtype: Any) -> Any:
  """`x` in `dtype` as it is: float64 with x64 off too, the tangent dtype of
  an output traced at a `jax.Array` made under `jax.enable_x64()`
  (`jc.make_closed_jaxpr`), where `astype` would make float32."""
  return jc.convert_weak(x, dtype, False)


def tangent_total(tangents: Sequence[Any]) -> Any:
  """The sum of every element of `tangents` (real parts), in float32: a scalar
  linear in them, which a NaN factor turns into NaN derivatives."""
  total: Any = np.float32(0)
  for t in tangents:
    total = total + jnp.sum(_real_parts(t), dtype=np.float32)
  return total


def _real_parts(t: Any) -> Any:
  return lax.real(t) + lax.imag(t) if jnp.issubdtype(t.dtype, jnp.complexfloating) else t


def _scaled(t: Any, c: Any) -> Any:
  """`t * c` for a real scalar `c`, exact for infinite complex parts."""
  if jnp.issubdtype(t.dtype, jnp.complexfloating):
    return lax.complex(lax.real(t) * c, lax.imag(t) * c)
  return t * c


def _added_to_real(t: Any, c: Any) -> Any:
  if jnp.issubdtype(t.dtype, jnp.complexfloating):
    return lax.complex(lax.real(t) + c, lax.imag(t))
  return t + c


def _raise_if_out_of_range(in_bounds: Any, declared: Any, values: Sequence[Any], *,
                           names: tuple[str, ...], padded: tuple[int, ...], what: str,
                           constraints: tuple[str, ...]) -> None:
  if bool(np.all(in_bounds)) and bool(np.all(declared)):
    return
  given = {n: np.asarray(v).tolist() for n, v in zip(names, values, strict=True)}
  bounds = {n: int(np.asarray(p)) for n, p in zip(names, padded, strict=True)}
  if not bool(np.all(in_bounds)):
    raise SizeRangeError(
        f"{what}: a traced logical size is outside [0, padded size], or is 0 where the "
        f"function is not defined for empty arrays: sizes {given}, padded sizes {bounds}. "
        "Each logical size must be at least 0 and at most its padded size (a pj.Ragged "
        "length at most the data's padded length); JAX raises for some functions of "
        "empty arrays (jnp.max without initial=, x[0]).\nWhat to do: pad the arguments "
        "to at least the largest size, fix the sizes passed, or make the function "
        "defined for empty arrays (jnp.max(x, initial=-jnp.inf)).")
  raise SizeRangeError(
      f"{what}: traced logical sizes {given} violate the declared constraints "
      f"{list(constraints)}.\nWhat to do: pass sizes that satisfy them (a jax.jit of "
      "the function itself raises at such sizes), or declare the constraints the "
      "function really needs.")


# --- the logical shapes of a data-dependent function's outputs ------------------

def ok_and_checked(in_contract: Any, failed: Any) -> Any:
  """Whether a call with traced sizes kept the contract and passed its checks."""
  return in_contract & (failed == 0) if isinstance(failed, jc.Tracer) else in_contract


def logical_shapes(traced: Any, sizes: dict[str, Any]) -> list[tuple[Any, ...]]:
  """Each output's logical shape: ints, and int32 scalars for dynamic axes
  (a size that would be negative on an empty selection, `y[1:]`, is 0). With
  traced sizes out of range, a violated constraint or a failed check, every
  dynamic entry is the int32 minimum (`size_range`: the counts are outputs
  too, poisoned like the rest)."""
  ok = sizes.get(IN_CONTRACT)
  out = []
  for aval in traced.out_avals:
    shape: list[Any] = []
    for d in aval.shape:
      if not jc.is_symbolic_dim(d):
        shape.append(int(d))
        continue
      value = jnp.maximum(_dims.evaluate_dim(d, sizes), 0)
      shape.append(value if ok is None else poison([value], ok)[0])
    out.append(tuple(shape))
  return out
