"""Block-diagonal products on packed rows, exact per example (`packed_pairs.py`).

A product of pairs of tokens per row (`softmax(scores) @ v`, `scores.T @ v`)
and one that makes them (`q @ k.T`, whose derivative is `ct_s @ k`) run as
one dense product per row: each token `i` of a row meets every token `c` of
the row, and the pairs of two examples add `0 * x` terms (the pair held at
zero off the blocks, or a cotangent selected to zero there). Those are 0 but
where `x` is inf or NaN: then NaN, in the row neighbours of the example that
holds `x`, where each example alone is finite (an inf among one example's
values; a NaN cotangent of a query with no key, in the backward pass).

`block_dot` is that product as a primitive of its own, so that its derivative
products are guarded too: JAX's transposes of `dot_general` are the same dense
products. Each of its token sums (the value where the pair axis `c` is
contracted, and each transpose that sums over `i` or `c`) runs dense, then,
only where its result is not all finite (a contamination is always NaN, so a
finite result is exact), again exactly, row by row and only in the rows
that are not all finite (a loop): `_exact` masks the operand that holds `c`
per `i` (`jax.vmap` over `i`, a select of the valid pairs), and the
non-finite entries are taken from it. An entry that is inf or NaN for its
example alone stays what it is there. The finite case costs one reduction
over a per-token result and a branch (`lax.cond`; under `jax.vmap` of the
primitive the whole batch shares it, `_batch`; a `jax.vmap` of the rules'
own JAX, as in `jax.jacrev`, makes the branches selects: both run). The transpose to the pair
operand (`ct_i * v_c`: no token sum, but inf or NaN off the blocks) is
selected on the valid pairs, which XLA fuses into the op that consumes it.
A transpose that sums over tokens is a `block_dot` itself (the cotangent
against the other operand, in that product's own axis order, then
transposed), so a second derivative is block_dot's too: guarded on its own
(a tangent that is not finite where its primal is, `sqrt` at 0, which a
repair decided on the primal product missed:
tests/test_packing_second_derivatives.py).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc


def _dot(x: Any, y: Any, p: dict[str, Any]) -> Any:
  return lax.dot_general(x, y, p["dn"], precision=p["precision"],
                         preferred_element_type=p["preferred_element_type"])


def _free(ndim: int, contracting: Any, batch: Any) -> list[int]:
  return [a for a in range(ndim) if a not in contracting and a not in batch]


def _out_axis(shapes: Any, p: dict[str, Any], operand: int, axis: int) -> int:
  """Where a free axis of an operand lands in the product."""
  (lc, rc), (lb, rb) = p["dn"]
  free_l = _free(len(shapes[0]), lc, lb)
  if operand == 0:
    return len(lb) + free_l.index(axis)
  return len(lb) + len(free_l) + _free(len(shapes[1]), rc, rb).index(axis)


def _exact(x: Any, y: Any, valid: Any, p: dict[str, Any]) -> Any:
  """The product with the operand that holds `c` (`mask_operand`) selected to
  zero off each `i`'s block: one product per `i` (`jax.vmap`)."""
  io, ia, mo = p["i_operand"], p["i_axis"], p["mask_operand"]
  (lc, rc), (lb, rb) = p["dn"]
  def drop(axes: Any, operand: int) -> tuple[int, ...]:
    return tuple(a - (a > ia) for a in axes) if operand == io else tuple(axes)
  dn = ((drop(lc, 0), drop(rc, 1)), (drop(lb, 0), drop(rb, 1)))
  ops = [x, y]

  def one(xi: Any, vi: Any) -> Any:
    args = list(ops)
    args[io] = xi
    m = args[mo]
    keep = lax.broadcast_in_dim(vi, m.shape, p["mask_dims"])
    args[mo] = lax.select(keep, m, lax.full_like(m, 0))
    return lax.dot_general(args[0], args[1], dn, precision=p["precision"],
                           preferred_element_type=p["preferred_element_type"])

  out_i = _out_axis([np.shape(x), np.shape(y)], p, io, ia)
  return jax.vmap(one, in_axes=(ia, p["valid_i"]), out_axes=out_i)(ops[io], valid)


def _guarded(fast: Any, exact_row: Any) -> Any:
  """`fast` where it is all finite (then no pair of two examples made NaN),
  else, in each leading slice (a row) that is not, its non-finite entries
  from `exact_row(r)`: one row at a time (a loop, so the exact product costs
  a row's work per row hit, and a compiled program's cost analysis counts one
  row of it, not the batch's)."""
  if not jnp.issubdtype(fast.dtype, jnp.inexact):
    return fast
  finite = jnp.isfinite(fast)

  def row(r: Any, acc: Any) -> Any:
    ok = lax.dynamic_index_in_dim(finite, r, keepdims=False)
    old = lax.dynamic_index_in_dim(acc, r, keepdims=False)
    new = lax.cond(jnp.all(ok), lambda: old, lambda: jnp.where(ok, old, exact_row(r)))
    return lax.dynamic_update_index_in_dim(acc, new, r, 0)

  return lax.cond(jnp.all(finite), lambda: fast,
                  lambda: lax.fori_loop(0, fast.shape[0], row, fast))


def _one_row(x: Any, y: Any, valid: Any, r: Any, p: dict[str, Any]) -> tuple[Any, ...]:
  """Row `r` of the operands (their batch axis 0, the product's axis 0; None
  stays None), of `valid`, and the params for the product of that row."""
  (lc, rc), (lb, rb) = p["dn"]
  assert lb[0] == 0 and rb[0] == 0
  def down(axes: Any) -> tuple[int, ...]:
    return tuple(a - 1 for a in axes)
  q = dict(p, dn=((down(lc), down(rc)), (down(lb[1:]), down(rb[1:]))),
           i_axis=p["i_axis"] - 1, mask_axis=p["mask_axis"] - 1)
  if p["mask_dims"][0] == 0:   # (valid's first axis is the rows': sliced too)
    valid = lax.dynamic_index_in_dim(valid, r, keepdims=False)
    q.update(valid_i=p["valid_i"] - 1, mask_dims=down(p["mask_dims"][1:]))
  else:
    q.update(mask_dims=down(p["mask_dims"]))
  def take(a: Any) -> Any:
    return None if a is None else lax.dynamic_index_in_dim(a, r, keepdims=False)
  return take(x), take(y), valid, q


def _mask_contracted(p: dict[str, Any]) -> bool:
  (lc, rc), _ = p["dn"]
  return p["mask_axis"] in (lc if p["mask_operand"] == 0 else rc)


def _impl(x: Any, y: Any, valid: Any, **p: Any) -> Any:
  fast = _dot(x, y, p)
  if not _mask_contracted(p):   # (`q @ k.T`: no token sum, the pairs loose)
    return fast
  return _guarded(fast, lambda r: _exact(*_one_row(x, y, valid, r, p)))


def _abstract(x: Any, y: Any, valid: Any, **p: Any) -> Any:
  out = jax.eval_shape(lambda a, b: _dot(a, b, p), jax.ShapeDtypeStruct(x.shape, x.dtype),  # type: ignore[no-untyped-call, unused-ignore]
                       jax.ShapeDtypeStruct(y.shape, y.dtype))  # type: ignore[no-untyped-call, unused-ignore]
  return jc.shaped_array(out.shape, out.dtype)


def _jvp(primals: Any, tangents: Any, **p: Any) -> tuple[Any, Any]:
  x, y, valid = primals
  dx, dy, _ = tangents
  out = block_dot_p.bind(x, y, valid, **p)
  terms = []
  if not jc.is_zero_tangent(dx):
    terms.append(block_dot_p.bind(dx, y, valid, **p))
  if not jc.is_zero_tangent(dy):
    terms.append(block_dot_p.bind(x, dy, valid, **p))
  if not terms:
    return out, jc.instantiate_zeros(dx, out)
  return out, terms[0] if len(terms) == 1 else terms[0] + terms[1]


def _transpose(ct: Any, x: Any, y: Any, valid: Any, **p: Any) -> list[Any]:
  linear = [jc.is_undefined_primal(x), jc.is_undefined_primal(y)]
  if jc.is_zero_tangent(ct) or linear[0] == linear[1]:
    if jc.is_zero_tangent(ct):
      return [None, None, None]
    raise NotImplementedError("block_dot transposed in both operands")
  k = 0 if linear[0] else 1
  aval = (x if linear[0] else y).aval
  known = y if k == 0 else x
  dn, order = _transposed_dn(np.ndim(ct), np.ndim(known), k, p, len(aval.shape))
  if k == p["i_operand"] and _mask_contracted(p):
    # (the pair operand of `P @ v`: `ct_i * v_c` sums no tokens; zero off the blocks)
    fast = lax.transpose(_convert(_dot(ct, known, dict(p, dn=dn)), aval), order)
    out = lax.select(_valid_on(valid, p, aval.shape), fast, lax.full_like(fast, 0))
  else:
    # (a sum over the tokens `i` or `c` of the other operand: a block product
    # itself, guarded, whose derivatives are block_dot's own: a second
    # derivative is guarded too, where JAX's of the guard's rules is not)
    ranks = (len(aval.shape), np.ndim(known)) if k == 0 else (np.ndim(known), len(aval.shape))
    product = block_dot_p.bind(ct, known, valid, **_transposed_params(p, k, dn, ranks))
    out = lax.transpose(_convert(product, aval), order)
  return [out, None, None] if k == 0 else [None, out, None]


def _convert(product: Any, aval: Any) -> Any:
  return product if product.dtype == aval.dtype else lax.convert_element_type(product, aval.dtype)


def _transposed_dn(ct_ndim: int, known_ndim: int, k: int, p: dict[str, Any],
                   ndim: int) -> tuple[Any, tuple[int, ...]]:
  """The dimension numbers of the product that transposes `dot_general` to
  operand `k` (of `ndim` axes), `ct` against the other operand, in its own
  axis order, and the permutation to operand k's axes: what JAX's transpose
  rule computes, before its transpose."""
  (lc, rc), (lb, rb) = p["dn"]
  x_free = _free(known_ndim if k else ndim, lc, lb)
  y_free = _free(ndim if k else known_ndim, rc, rb)
  batch = tuple(range(len(lb)))
  lhs_free = tuple(range(len(lb), len(lb) + len(x_free)))
  rhs_free = tuple(range(len(lb) + len(x_free), ct_ndim))
  if k == 0:   # ct's rhs-free axes against y's free axes: x's batch, free, contracting
    dn = ((rhs_free, tuple(y_free)), (batch, tuple(rb)))
    source = [*lb, *x_free, *(lc[list(rc).index(a)] for a in sorted(rc))]
  else:
    dn = ((lhs_free, tuple(x_free)), (batch, tuple(lb)))
    source = [*rb, *y_free, *(rc[list(lc).index(a)] for a in sorted(lc))]
  return dn, tuple(source.index(a) for a in range(ndim))


def _transposed_params(p: dict[str, Any], k: int, dn: Any, ranks: tuple[int, int]
                       ) -> dict[str, Any]:
  """block_dot's params for the product of `ct` (operand 0) and the operand
  other than `k` (operand 1), of `dn`, that sums over tokens: its free token
  (`i`), the token it sums over (`masked`), and where `valid`'s axes lie.
  `valid` pairs the original `i` (its axis `valid_i`) with the tokens of the
  original mask operand (its batch axes and mask axis: `mask_dims`); the
  pairs are symmetric, so either token may be the new `i`."""
  io, ia, mo, ma, vi = (p["i_operand"], p["i_axis"], p["mask_operand"], p["mask_axis"],
                        p["valid_i"])
  (lc, rc), (lb, rb) = p["dn"]
  batches, contracting = (lb, rb), (lc, rc)
  def in_ct(operand: int, axis: int) -> int:   # a free axis of an operand, in ct
    return _out_axis([range(ranks[0]), range(ranks[1])], p, operand, axis)
  rest = [d for d in range(len(p["mask_dims"]) + 1) if d != vi]
  on_mask = dict(zip(rest, p["mask_dims"], strict=True))   # valid's axes: the mask operand's
  c_dim = next(d for d in rest if on_mask[d] == ma)   # (valid's axis of the summed token)
  if _mask_contracted(p):   # `P.T @ ct` (k the mask operand): ct's `i` summed, P's `c` free
    new_vi = c_dim
    dims = {d: list(batches[mo]).index(on_mask[d]) for d in rest if d != c_dim}
    dims[vi] = in_ct(io, ia)
    i = (1, int(contracting[io][list(contracting[mo]).index(ma)]))
    masked = (0, in_ct(io, ia))
  elif k == io:   # `ct_s @ k`: the pairs' `c` summed with k's tokens, `i` free
    new_vi = vi
    dims = dict(on_mask)
    i, masked = (0, in_ct(io, ia)), (1, ma)
  else:   # `ct_s.T @ q`: the pairs' `i` summed with q's tokens, `c` free (the new `i`)
    new_vi = c_dim
    dims = {d: int(batches[io][list(batches[mo]).index(on_mask[d])]) for d in rest
            if d != c_dim}
    dims[vi] = ia
    i, masked = (0, in_ct(mo, ma)), (1, ia)
  mask_dims = tuple(dims[d] for d in range(len(rest) + 1) if d != new_vi)
  return dict(p, dn=dn, i_operand=i[0], i_axis=i[1], mask_operand=masked[0],
              mask_axis=masked[1], valid_i=new_vi, mask_dims=mask_dims)


def _valid_on(valid: Any, p: dict[str, Any], shape: Any) -> Any:
  """The valid pairs broadcast onto the `i` operand, that holds `c` where
  the mask operand does (a contracted or batch axis of both)."""
  (lc, rc), (lb, rb) = p["dn"]
  mine, theirs = ((lc, lb), (rc, rb)) if p["i_operand"] == 0 else ((rc, rb), (lc, lb))
  def across(a: int) -> int:   # an axis of the mask operand: the same of the i operand
    if a in theirs[0]:
      return int(mine[0][list(theirs[0]).index(a)])
    return int(mine[1][list(theirs[1]).index(a)])
  rest = [d for d in range(np.ndim(valid)) if d != p["valid_i"]]
  dims = {p["valid_i"]: p["i_axis"]}
  dims.update({d: across(a) for d, a in zip(rest, p["mask_dims"], strict=True)})
  order = sorted(dims, key=lambda d: dims[d])
  return lax.broadcast_in_dim(lax.transpose(valid, order), tuple(shape),
                              tuple(dims[d] for d in order))


def _batch(args: Any, dims: Any, **p: Any) -> tuple[Any, int]:
  """`jax.vmap` of the primitive: the batch a leading batch axis of the
  product (the unbatched operand broadcast), one guard for the whole batch."""
  x, y, valid = args
  bx, by, bv = dims
  size = next(np.shape(a)[d] for a, d in zip(args, dims, strict=True) if d is not None)
  def front(a: Any, d: Any) -> Any:
    if d is None:
      return jnp.broadcast_to(a[None], (size, *np.shape(a)))
    return jnp.moveaxis(a, d, 0)
  x, y = front(x, bx), front(y, by)
  def up(axes: Any) -> tuple[int, ...]:
    return tuple(a + 1 for a in axes)
  (lc, rc), (lb, rb) = p["dn"]
  q = dict(p, dn=((up(lc), up(rc)), ((0, *up(lb)), (0, *up(rb)))),
           i_axis=p["i_axis"] + 1, mask_axis=p["mask_axis"] + 1)
  if bv is None:
    q["mask_dims"] = up(p["mask_dims"])
  else:
    valid = jnp.moveaxis(valid, bv, 0)
    q.update(valid_i=p["valid_i"] + 1, mask_dims=(0, *up(p["mask_dims"])))
  return block_dot_p.bind(x, y, valid, **q), 0


block_dot_p = jc.ruled_primitive("polyjit_packed_block_dot", _impl, _abstract, _jvp,
                                 _transpose, _batch)


def block_dot(x: Any, y: Any, valid: Any, dn: Any, *, i: tuple[int, int],
              masked: tuple[int, int], precision: Any = None,
              preferred_element_type: Any = None) -> Any:
  """`lax.dot_general(x, y, dn)` of two operands with the rows as batch axis
  0, where token `i` of a row (`i = (operand, axis)`) meets token `c` of the
  row (`masked = (the other operand, axis)`) only in a valid pair (`valid`,
  `(rows, row_length, row_length)`, symmetric): the same value and
  derivatives, exact per example (the module's docstring)."""
  (lc, rc), (lb, rb) = dn
  assert i[0] != masked[0]
  dn = ((tuple(int(a) for a in lc), tuple(int(a) for a in rc)),
        (tuple(int(a) for a in lb), tuple(int(a) for a in rb)))
  return block_dot_p.bind(x, y, valid, dn=dn, precision=precision,
                          preferred_element_type=preferred_element_type,
                          i_operand=i[0], i_axis=i[1], mask_operand=masked[0],
                          mask_axis=masked[1], valid_i=1, mask_dims=(0, masked[1]))
