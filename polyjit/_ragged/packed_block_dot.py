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
The derivatives of the guard's own rules (a second derivative) are JAX's.

The JVP of a product in both operands, `dx @ y + x @ dy`, is a primitive of
its own (`block_dot_tangent_p`), so that its transpose, the two cotangents
(`q @ k.T`'s `ct_s @ k` and `ct_s.T @ q`), shares one check and one branch
(`_guarded_together`): a branch costs a training step more than the check
does (`benchmarks/packing_guard_cost.py`).
"""

from __future__ import annotations

import functools
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
  out, = _guarded_together([(fast, exact_row)])
  return out


def _guarded_together(products: list[tuple[Any, Any]]) -> list[Any]:
  """`_guarded` of several products `(fast, exact_row)` behind one check and
  one branch: a branch costs a training step more than its check does
  (`benchmarks/packing_guard_cost.py`), and a transpose in both operands
  (`q @ k.T`'s `ct_s @ k` and `ct_s.T @ q`) needs two products."""
  outs = [fast for fast, _ in products]
  guarded = [i for i, fast in enumerate(outs) if jnp.issubdtype(fast.dtype, jnp.inexact)]
  if not guarded:
    return outs
  finite = {i: jnp.isfinite(outs[i]) for i in guarded}
  clean = functools.reduce(jnp.logical_and, [jnp.all(finite[i]) for i in guarded])
  repaired = lax.cond(clean, lambda: tuple(outs[i] for i in guarded),
                      lambda: tuple(_repaired(outs[i], finite[i], products[i][1])
                                    for i in guarded))
  for i, out in zip(guarded, repaired, strict=True):
    outs[i] = out
  return outs


def _repaired(fast: Any, finite: Any, exact_row: Any) -> Any:
  """`fast` with the non-finite entries of each row that has one from
  `exact_row(r)`."""
  def row(r: Any, acc: Any) -> Any:
    ok = lax.dynamic_index_in_dim(finite, r, keepdims=False)
    old = lax.dynamic_index_in_dim(acc, r, keepdims=False)
    new = lax.cond(jnp.all(ok), lambda: old, lambda: jnp.where(ok, old, exact_row(r)))
    return lax.dynamic_update_index_in_dim(acc, new, r, 0)

  return lax.fori_loop(0, fast.shape[0], row, fast)


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
  if not jc.is_zero_tangent(dx) and not jc.is_zero_tangent(dy):
    # (one primitive: its transpose guards both cotangents behind one branch)
    return out, block_dot_tangent_p.bind(dx, dy, x, y, valid, **p)
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
  fast, exact_row = _transposed(ct, x, y, valid, k, p)
  out = fast if exact_row is None else _guarded(fast, exact_row)
  return [out, None, None] if k == 0 else [None, out, None]


def _transposed(ct: Any, x: Any, y: Any, valid: Any, k: int,
                p: dict[str, Any]) -> tuple[Any, Any]:
  """The cotangent of operand `k` (the linear one) as its dense product and
  the exact rows to guard it with (`_guarded`), or None where no guard is
  needed."""
  aval = (x if k == 0 else y).aval
  struct = jax.ShapeDtypeStruct(aval.shape, aval.dtype)  # type: ignore[no-untyped-call, unused-ignore]
  def along(f: Any) -> Any:   # the product as a linear function of operand k
    return (lambda a: f(a, y)) if k == 0 else (lambda b: f(x, b))
  fast, = jax.linear_transpose(along(lambda a, b: _dot(a, b, p)), struct)(ct)
  if k == p["i_operand"] and _mask_contracted(p):
    # (the pair operand of `P @ v`: `ct_i * v_c` sums no tokens; zero off the blocks)
    return lax.select(_valid_on(valid, p, aval.shape), fast, lax.full_like(fast, 0)), None
  # (a sum over the tokens `i` or `c` of the other operand)
  def exact_row(r: Any) -> Any:
    xr, yr, vr, q = _one_row(x if k else None, y if not k else None, valid, r, p)
    known = yr if k == 0 else xr
    row = jax.ShapeDtypeStruct(aval.shape[1:], aval.dtype)  # type: ignore[no-untyped-call, unused-ignore]
    f = (lambda a: _exact(a, known, vr, q)) if k == 0 else (lambda b: _exact(known, b, vr, q))
    return jax.linear_transpose(f, row)(lax.dynamic_index_in_dim(ct, r, keepdims=False))[0]
  return fast, exact_row


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
  (x, y), valid, q = _batched(args, dims, p)
  return block_dot_p.bind(x, y, valid, **q), 0


def _batched(args: Any, dims: Any, p: dict[str, Any]) -> tuple[list[Any], Any, dict[str, Any]]:
  """The operands (every argument but the last, `valid`) with the batch
  axis first (an unbatched one broadcast), `valid`, and the params of the
  product with that leading batch axis."""
  *operands, valid = args
  *operand_dims, bv = dims
  size = next(np.shape(a)[d] for a, d in zip(args, dims, strict=True) if d is not None)
  def front(a: Any, d: Any) -> Any:
    if d is None:
      return jnp.broadcast_to(a[None], (size, *np.shape(a)))
    return jnp.moveaxis(a, d, 0)
  operands = [front(a, d) for a, d in zip(operands, operand_dims, strict=True)]
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
  return operands, valid, q


block_dot_p = jc.ruled_primitive("polyjit_packed_block_dot", _impl, _abstract, _jvp,
                                 _transpose, _batch)


# --- the tangent of both operands: `dx @ y + x @ dy` --------------------------

def _tangent_impl(dx: Any, dy: Any, x: Any, y: Any, valid: Any, **p: Any) -> Any:
  return _impl(dx, y, valid, **p) + _impl(x, dy, valid, **p)


def _tangent_abstract(dx: Any, dy: Any, x: Any, y: Any, valid: Any, **p: Any) -> Any:
  return _abstract(x, y, valid, **p)


def _tangent_jvp(primals: Any, tangents: Any, **p: Any) -> tuple[Any, Any]:
  """A second derivative: `d(dx @ y + x @ dy)`, term by term."""
  dx, dy, x, y, valid = primals
  tdx, tdy, tx, ty, _ = tangents
  out = block_dot_tangent_p.bind(dx, dy, x, y, valid, **p)
  terms = [block_dot_p.bind(a, b, valid, **p)
           for a, b in ((tdx, y), (x, tdy), (tx, dy), (dx, ty))
           if not jc.is_zero_tangent(a) and not jc.is_zero_tangent(b)]
  if not terms:
    return out, jc.instantiate_zeros(tdx, out)
  return out, functools.reduce(lambda a, b: a + b, terms)


def _tangent_transpose(ct: Any, dx: Any, dy: Any, x: Any, y: Any, valid: Any,
                       **p: Any) -> list[Any]:
  """Both cotangents, their token sums guarded behind one branch."""
  if jc.is_zero_tangent(ct):
    return [None] * 5
  if jc.is_undefined_primal(x) or jc.is_undefined_primal(y):
    raise NotImplementedError("block_dot's tangent transposed in a primal operand")
  products = [_transposed(ct, d, y, valid, 0, p) if k == 0 else _transposed(ct, x, d, valid, 1, p)
              for k, d in enumerate((dx, dy)) if jc.is_undefined_primal(d)]
  sums = iter(_guarded_together([(f, e) for f, e in products if e is not None]))
  outs = iter([f if e is None else next(sums) for f, e in products])
  return [next(outs) if jc.is_undefined_primal(d) else None for d in (dx, dy)] + [None] * 3


def _tangent_batch(args: Any, dims: Any, **p: Any) -> tuple[Any, int]:
  operands, valid, q = _batched(args, dims, p)
  return block_dot_tangent_p.bind(*operands, valid, **q), 0


block_dot_tangent_p = jc.ruled_primitive("polyjit_packed_block_dot_tangent", _tangent_impl,
                                         _tangent_abstract, _tangent_jvp, _tangent_transpose,
                                         _tangent_batch)


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
