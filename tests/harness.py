"""Reference checks for masking rules.

A `Case` is a function, its specs, and a generator of unpadded arguments for
given logical sizes. `check(case, mode)` runs `pj.mask(fun)` on padded copies
whose padding holds NaN, inf and huge values, and compares the valid region of
every output with `fun` on the unpadded arguments:

* eager: one call per logical size;
* jit: `jax.jit` of the masked function, one call per logical size;
* vmap: one call of `jax.jit(jax.vmap(masked))` over examples of different
  logical sizes; `jax.vmap(masked)` eagerly for each table's `eager_vmap`
  sample (`table_test`);
* grad: `jax.vjp` with cotangents that carry NaN in their padding; the valid
  region of every gradient must match the unpadded VJP, and the padding of
  gradients with respect to padded inputs must be exactly zero.
* jvp: `jax.jvp` of the masked function (forward mode, issue 26) with tangents
  that carry NaN in their padding; the valid region of every output tangent
  must match the unpadded JVP.

Eager, jit and vmap also draw one empty size (issue 33: the first size of the
case's first sizes at 0, where the case declares no constraints): where `fun`
works on the empty arrays the results must match; where JAX raises there, an
eager call must raise too and a traced one must return no plausible number.

Eager `jax.vmap` of the masked function dispatches every batched op by itself:
JAX compiles each op at each batch shape, dozens of compiles per case, where
the jitted vmap compiles one program (the same batching rules, the same masking
rules, traced the same way). Eager masking is checked by the eager mode; eager
vmap runs for a sample of rows that together reach every rule module that a
row not `compiled` reaches (tests/test_coverage.py checks that).

The references (`fun`'s values, VJPs and JVPs on the unpadded arguments) run
under jax.jit, one program per case and sizes that every mode shares (the
value, the VJP and the JVP together: `_fused_reference`), compiled at LLVM's
level 0 (`reference_options`), where `fun` traces there; op by op, eager JAX
compiles each op at each size. Only
the masked side is what a mode checks (eagerly, under jit, ...).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

MODES = ("eager", "jit", "vmap", "grad", "jvp")


@dataclasses.dataclass
class Case:
  name: str
  fun: Callable
  in_shapes: Sequence[Any]
  args: Callable[[np.random.Generator, dict], list]   # unpadded args for sizes
  sizes: Sequence[dict] = ({"n": 1}, {"n": 3}, {"n": 6})
  padded: dict = dataclasses.field(default_factory=lambda: {"n": 8})
  constraints: Sequence[str] = ()
  modes: Sequence[str] = MODES
  rtol: float = 2e-5
  atol: float = 2e-5
  #: Run the grad and jvp checks of the masked function under jax.jit: for
  #: large functions, whose op-by-op dispatch compiles every op at every size.
  #: (The vmap check runs jitted for every row but a table's `eager_vmap`
  #: sample; the reference always runs under jax.jit where `fun` traces:
  #: `reference`.)
  compiled: bool = False
  #: Whether the vmap check runs `jax.vmap(masked)` eagerly (else under
  #: jax.jit): set by `table_test` for its sample of the table's rows.
  eager_vmap: bool = False
  #: Whether every mode's reference comes from one program (`_fused_reference`):
  #: set by `table_test`, whose rows run in every mode; a case checked in one
  #: mode (tests/test_fuzz.py) compiles only what that mode needs.
  fused_references: bool = False
  #: The reference's jitted programs, built once per case (`_program`).
  programs: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

  def __str__(self):
    return self.name


def normal(*shape, dtype=np.float32):
  """An argument generator piece: standard normal values of `shape`."""
  return lambda rng, s: rng.standard_normal(_shape(shape, s)).astype(dtype)


def positive(*shape, dtype=np.float32):
  return lambda rng, s: (rng.uniform(0.5, 2.0, _shape(shape, s))).astype(dtype)


def ints(*shape, low=-5, high=5, dtype=np.int32):
  return lambda rng, s: rng.integers(low, high, _shape(shape, s)).astype(dtype)


def bools(*shape):
  return lambda rng, s: rng.random(_shape(shape, s)) < 0.5


def const(value):
  return lambda rng, s: value


def _shape(shape, sizes):
  return tuple(d if isinstance(d, int) else eval(d, {}, dict(sizes)) for d in shape)


def make(*pieces):
  """Combines argument generator pieces into `Case.args`."""
  return lambda rng, sizes: [p(rng, sizes) for p in pieces]


# --- padding with garbage ----------------------------------------------------

def garbage_like(x: np.ndarray, rng) -> np.ndarray:
  dtype = x.dtype
  if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
    choices = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30], dtype=np.float64)
    return rng.choice(choices, x.shape).astype(dtype)
  if np.issubdtype(dtype, np.integer):
    info = np.iinfo(dtype)
    return rng.choice(np.array([info.max, info.min, info.max // 3, -7 if info.min < 0 else 7],
                               dtype=dtype), x.shape)
  if dtype == np.bool_:
    return rng.random(x.shape) < 0.5
  return np.zeros_like(x)


def pad_to(x, template, rng):
  x = np.asarray(x)
  out = garbage_like(np.asarray(template), rng)
  out[tuple(slice(0, s) for s in x.shape)] = x
  return out


def padded_args(case: Case, unpadded, rng):
  template = case.args(np.random.default_rng(0), case.padded)
  return jax.tree.map(lambda x, t: pad_to(x, t, rng), unpadded, template)


def valid(x, shape):
  return np.asarray(x)[tuple(slice(0, s) for s in shape)]


# --- comparisons -------------------------------------------------------------

def assert_close(actual, expected, case: Case, what: str):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
  if expected.dtype == jax.dtypes.float0:
    return
  if np.issubdtype(expected.dtype, np.inexact):
    np.testing.assert_allclose(actual, expected, rtol=case.rtol, atol=case.atol,
                               equal_nan=True, err_msg=what)
  else:
    np.testing.assert_array_equal(actual, expected, err_msg=what)


def _masked(case: Case):
  return pj.mask(case.fun, case.in_shapes, constraints=case.constraints)


def empty_sizes(case: Case):
  """The case's first sizes with the first of them at 0 (None under constraints)."""
  if case.constraints:
    return None
  sizes = dict(case.sizes[0])
  sizes[sorted(sizes)[0]] = 0
  return sizes


def _empty_reference(case: Case, unpadded):
  """`fun` on the empty arguments, or None where JAX raises there."""
  try:
    return reference(case, unpadded)
  except Exception:
    return None


def _check_empty(case: Case, masked, run, mode: str, rng):
  sizes = empty_sizes(case)
  if sizes is None:
    return
  unpadded = case.args(rng, sizes)
  padded = padded_args(case, unpadded, rng)
  expected = _empty_reference(case, unpadded)
  if expected is None:
    if mode == "eager":
      with pytest.raises(Exception):
        masked(padded, sizes)
    else:   # nothing can raise in the program: no plausible number
      for o in jax.tree.leaves(run(padded, sizes)):
        if np.issubdtype(np.asarray(o).dtype, np.inexact):
          assert np.isnan(np.asarray(o)).all(), f"{case.name} {mode} sizes={sizes}"
    return
  outs, shapes = _outputs_and_shapes(masked, run(padded, sizes), padded, sizes)
  if mode == "jit" and _poisoned(outs) and not _differentiable(case, unpadded):
    return   # JAX's own derivative fails on these empty arrays: the traced path refuses
  for i, (o, e, s) in enumerate(zip(jax.tree.leaves(outs), jax.tree.leaves(expected),
                                    _shape_leaves(shapes, expected))):
    assert_close(valid(o, s), e, case, f"{case.name} {mode} sizes={sizes} output {i}")


def _poisoned(outs) -> bool:
  leaves = [np.asarray(o) for o in jax.tree.leaves(outs)]
  floats = [o for o in leaves if np.issubdtype(o.dtype, np.inexact)]
  return bool(floats) and all(np.isnan(o).all() for o in floats)


def _differentiable(case: Case, unpadded) -> bool:
  """Whether JAX traces `fun`'s VJP on these (empty) arguments."""
  args = jax.tree.map(jnp.asarray, unpadded)
  try:
    jax.eval_shape(lambda *a: jax.vjp(case.fun, *a)[0], *args)
    jax.eval_shape(lambda *a: jax.vjp(case.fun, *a)[1](
        jax.tree.map(jnp.zeros_like, case.fun(*a))), *args)
  except Exception:
    return False
  return True


def check(case: Case, mode: str, seed: int = 0, eager_vmap: bool = False):
  """Checks `case` in `mode`; the vmap mode runs `jax.vmap(masked)` eagerly
  where `eager_vmap`, else under jax.jit."""
  rng = np.random.default_rng(seed)
  masked = _masked(case)
  if mode == "vmap":
    return _check_vmap(case, masked, rng, eager_vmap)
  run = jax.jit(masked) if mode == "jit" else masked
  if mode in ("eager", "jit") and not _data_dependent_case(case, masked, rng):
    _check_empty(case, masked, run, mode, rng)
  for sizes in case.sizes:
    unpadded = case.args(rng, sizes)
    padded = padded_args(case, unpadded, rng)
    if mode == "grad":
      _check_grad(case, masked, unpadded, padded, sizes, rng)
      continue
    if mode == "jvp":
      _check_jvp(case, masked, unpadded, padded, sizes, rng)
      continue
    expected = reference(case, unpadded)
    outs, shapes = _outputs_and_shapes(masked, run(padded, sizes), padded, sizes)
    for i, (o, e, s) in enumerate(zip(jax.tree.leaves(outs), jax.tree.leaves(expected),
                                      _shape_leaves(shapes, expected))):
      assert_close(valid(o, s), e, case, f"{case.name} {mode} sizes={sizes} output {i}")


def _data_dependent_case(case: Case, masked, rng) -> bool:
  """Whether the case creates data-dependent sizes (their emptiness is tested
  by their own table), from padded arguments at the case's first sizes."""
  return _data_dependent(masked, padded_args(case, case.args(rng, case.sizes[0]), rng))


def _data_dependent(masked, padded) -> bool:
  """Whether the function creates data-dependent sizes (x[x > 0], nonzero,
  unique): then pj.mask returns (outputs, shapes), shapes computed in the program."""
  return bool(masked.trace(padded).size_names)


def _outputs_and_shapes(masked, result, padded, sizes):
  """(outputs, logical shapes): from the program for data-dependent sizes
  (None under vmap, where they are per example), else from the sizes."""
  if _data_dependent(masked, padded):
    outs, shapes = result
    return outs, jax.tree.map(int, shapes) if sizes is not None else shapes
  return result, (masked.logical_shapes(padded, sizes) if sizes is not None else None)


def _first_of_pair(pullback, shapes):
  """The pullback of (outputs, shapes) as a pullback of the outputs alone
  (the shapes are integers: float0 cotangents)."""
  zero_shapes = jax.tree.map(lambda _: np.zeros((), jax.dtypes.float0), shapes)
  return lambda cts: pullback((cts, zero_shapes))


def table_test(cases: Sequence[Case], eager_vmap: Sequence[str] | None = None):
  """A table's cases by name, and the test that checks each in every mode.

  In a test module: `CASES_BY_NAME, test_rule = table_test(CASES)`.

  `eager_vmap` names the rows whose vmap check runs `jax.vmap(masked)`
  eagerly (the others run it under jax.jit; `Case.eager_vmap`); by default
  the table's first row that is not `compiled` and has a vmap mode
  (tests/test_coverage.py: the samples reach every rule module that a row
  not `compiled` reaches).
  """
  by_name = {c.name: c for c in cases}
  assert len(by_name) == len(cases), "case names must be unique"
  for c in cases:
    c.fused_references = True
  if eager_vmap is None:
    eager_vmap = [c.name for c in cases if not c.compiled and "vmap" in c.modes][:1]
  for name in eager_vmap:
    assert name in by_name and "vmap" in by_name[name].modes, f"no vmap row {name!r}"
    by_name[name].eager_vmap = True

  @pytest.mark.parametrize("mode", MODES)
  @pytest.mark.parametrize("name", list(by_name))
  def test_rule(name, mode):
    case = by_name[name]
    if mode not in case.modes:
      pytest.skip(f"{mode} does not apply to {name}")
    check(case, mode, eager_vmap=case.eager_vmap)

  return by_name, test_rule


def reference(case: Case, unpadded):
  """`fun` on the unpadded arguments, as JAX arrays (NumPy indexing differs)."""
  args = jax.tree.map(jnp.asarray, unpadded)
  fused = _fused_reference(case, args)
  if fused is not None:
    return fused[0]
  return _unpadded(case, lambda: _program(case, "value", lambda: case.fun)(*args),
                   lambda: case.fun(*args))


def _fused_reference(case: Case, args, cts=None, tangents=None):
  """(outputs, input cotangents for `cts`, output tangents for `tangents`) of
  `fun` on the unpadded `args`, from one jitted program per case and sizes
  that every mode shares, or None where that program does not trace or run
  (then each mode runs its own reference program, `_unpadded`, as before).

  The eager, jit, vmap, grad and jvp modes draw different arguments of the
  same shapes: one program computing the value, the VJP and the JVP is
  compiled once per size for all five, where a program per kind was compiled
  three times. Each mode reads its own part; the parts it does not check get
  zero cotangents or tangents. `cts` is the flat list of output cotangents
  (float0 for integer outputs), `tangents` those of the inexact input leaves."""
  if not case.fused_references:
    return None
  leaves, in_tree = jax.tree.flatten(tuple(args))
  diff = tuple(i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.inexact))
  key = (in_tree, diff, tuple((x.shape, x.dtype) for x in leaves))
  failed = case.programs.setdefault("fused-failed", set())
  if key in failed:
    return None
  try:
    if cts is None:
      outs = _program(case, "fused-shapes", lambda: case.fun).eval_shape(*args)
      cts = [np.zeros(o.shape, o.dtype if jnp.issubdtype(o.dtype, jnp.inexact)
                      else jax.dtypes.float0) for o in jax.tree.leaves(outs)]
    if tangents is None:
      tangents = [jnp.zeros_like(leaves[i]) for i in diff]
    return _program(case, "fused", lambda: _value_vjp_jvp(case.fun, in_tree, diff),
                    in_tree, diff)(leaves, cts, tangents)
  except Exception:
    failed.add(key)
    return None


def _value_vjp_jvp(fun, in_tree, diff):
  def run(leaves, cts, tangents):
    args = jax.tree.unflatten(in_tree, leaves)
    outs, pullback = jax.vjp(fun, *args)
    grads = pullback(jax.tree.unflatten(jax.tree.structure(outs), cts))
    _, touts = jax.jvp(lambda *v: fun(*jax.tree.unflatten(in_tree, _with(leaves, diff, v))),
                       tuple(leaves[i] for i in diff), tuple(tangents))
    return outs, grads, touts
  return run


def _unpadded(case: Case, jitted: Callable, eager: Callable):
  """The reference computation `jitted()`, one compiled program per case and
  sizes, or `eager()` (the same computation op by op) where `fun` does not
  trace under jax.jit (x[x > 0], jnp.unique: shapes that depend on values).

  Eager JAX compiles every op at every size it meets (op-by-op dispatch): a
  case's references cost dozens of compiles where one program per size does.
  Either way it is `fun` on the unpadded arguments; where JAX raises eagerly
  it raises under jit too (shapes, dtypes), and the eager call then decides.
  A `compiled` case's reference was always jitted: its errors are kept."""
  if case.compiled:
    return jitted()
  try:
    return jitted()
  except Exception:
    return eager()


def _program(case: Case, kind: str, make_fun: Callable, *static):
  """`jax.jit(make_fun())`, built once per case, `kind` and `static` values:
  one wrapper, so that JAX's dispatch and compile caches serve every mode's
  call at the same sizes."""
  key = (kind, *static)
  program = case.programs.get(key)
  if program is None:
    program = case.programs[key] = jax.jit(make_fun(), compiler_options=reference_options())
  return program


_REFERENCE_OPTIONS: list = []


def reference_options() -> dict:
  """XLA options for the reference programs: LLVM's optimization level 0.

  A reference runs once, on a few numbers: compiling it is its whole cost, and
  the backend's optimizations are most of that (40% less compile time without
  them, on the larger programs of tests/test_packing.py). The level changes how
  the machine code is optimized: XLA's HLO passes still run, and LLVM takes
  no fast-math liberties at any level (a product and sum may still round once
  or twice, fused or not, as between two JAX versions: within every
  tolerance). The masked side, the one a test checks, keeps the default
  options. Where a JAX or backend does not take the option, none is given."""
  if not _REFERENCE_OPTIONS:
    options = {"xla_backend_optimization_level": 0}
    try:
      jax.jit(lambda x: x + 1, compiler_options=options)(np.float32(1))
    except Exception:
      options = {}
    _REFERENCE_OPTIONS.append(options)
  return _REFERENCE_OPTIONS[0]


def _fun(case: Case):
  return jax.jit(case.fun) if case.compiled else case.fun


def _reference_vjp(case: Case, args, ref_cts):
  """(outputs, input cotangents) of `fun` on the unpadded `args` with output
  cotangents `ref_cts` (a flat list, float0 for integer outputs)."""
  def vjp(fun):
    def run(args, cts):
      outs, pullback = jax.vjp(fun, *args)
      return outs, pullback(jax.tree.unflatten(jax.tree.structure(outs), cts))
    return run
  fused = _fused_reference(case, args, cts=ref_cts)
  if fused is not None:
    return fused[:2]
  return _unpadded(case, lambda: _program(case, "vjp", lambda: vjp(case.fun))(args, ref_cts),
                   lambda: vjp(_fun(case))(args, ref_cts))


def _shape_leaves(shapes, like):
  return jax.tree.structure(like).flatten_up_to(shapes)


def _check_vmap(case: Case, masked, rng, eager: bool):
  all_sizes = list(case.sizes)
  empty = empty_sizes(case)
  if (empty is not None and not _data_dependent_case(case, masked, rng)
      and _empty_reference(case, case.args(rng, empty)) is not None
      and _differentiable(case, case.args(rng, empty))):
    all_sizes.append(empty)   # an empty example in the batch
  unpadded = [case.args(rng, s) for s in all_sizes]
  padded = [padded_args(case, u, rng) for u in unpadded]
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *padded)
  env = {k: np.array([s[k] for s in all_sizes], np.int32) for k in all_sizes[0]}
  batched = jax.vmap(masked)
  outs = (batched if eager else jax.jit(batched))(stacked, env)
  outs, all_shapes = _outputs_and_shapes(masked, outs, padded[0], None)
  for b, (u, sizes) in enumerate(zip(unpadded, all_sizes)):
    expected = reference(case, u)
    shapes = (masked.logical_shapes(padded[b], sizes) if all_shapes is None
              else jax.tree.map(lambda d: int(d if np.ndim(d) == 0 else np.asarray(d)[b]),
                                all_shapes))
    for i, (o, e, s) in enumerate(zip(jax.tree.leaves(outs), jax.tree.leaves(expected),
                                      _shape_leaves(shapes, expected))):
      assert_close(valid(np.asarray(o)[b], s), e, case,
                   f"{case.name} vmap example {b} sizes={sizes} output {i}")


def _cotangent(x, shape, rng):
  x = np.asarray(x)
  if not np.issubdtype(x.dtype, np.inexact):
    return np.zeros(x.shape, jax.dtypes.float0)
  ct = np.full(x.shape, np.nan, x.dtype)
  ct[tuple(slice(0, s) for s in shape)] = rng.standard_normal(shape).astype(x.dtype)
  return ct


def _check_grad(case: Case, masked, unpadded, padded, sizes, rng):
  run = jax.jit(masked) if case.compiled else masked
  if _data_dependent(masked, padded):
    (outs, shapes), pullback = jax.vjp(lambda *a: run(a, sizes), *padded)
    shapes = jax.tree.map(int, shapes)
    pullback = _first_of_pair(pullback, shapes)
  else:
    outs, pullback = jax.vjp(lambda *a: run(a, sizes), *padded)
    shapes = masked.logical_shapes(padded, sizes)
  out_leaves, tree = jax.tree.flatten(outs)
  shape_leaves = tree.flatten_up_to(shapes)
  cts = [_cotangent(o, s, rng) for o, s in zip(out_leaves, shape_leaves)]
  grads = pullback(jax.tree.unflatten(tree, cts))
  ref_cts = [valid(c, s) if c.dtype != jax.dtypes.float0
             else np.zeros(s, jax.dtypes.float0) for c, s in zip(cts, shape_leaves)]
  _, expected = _reference_vjp(case, jax.tree.map(jnp.asarray, tuple(unpadded)), ref_cts)
  for i, (g, e, p) in enumerate(zip(jax.tree.leaves(grads), jax.tree.leaves(expected),
                                    jax.tree.leaves(padded))):
    g = np.asarray(g)
    if g.dtype == jax.dtypes.float0:
      continue
    what = f"{case.name} grad sizes={sizes} input {i}"
    got = valid(g, np.shape(e))
    np.testing.assert_allclose(got, e, rtol=max(case.rtol, 1e-4), atol=max(case.atol, 1e-4),
                               equal_nan=True, err_msg=what)
    outside = g.copy()
    outside[tuple(slice(0, s) for s in np.shape(e))] = 0
    assert np.all(outside == 0), f"{what}: gradient padding is not zero: {g}"


def _check_jvp(case: Case, masked, unpadded, padded, sizes, rng):
  run = jax.jit(masked) if case.compiled else masked
  padded_leaves, in_tree = jax.tree.flatten(padded)
  unpadded_leaves = jax.tree.leaves(unpadded)
  diff = [i for i, x in enumerate(unpadded_leaves)
          if np.issubdtype(np.asarray(x).dtype, np.inexact)]
  if not diff:
    pytest.skip(f"{case.name} has no inexact inputs")
  tangents = [_cotangent(padded_leaves[i], np.shape(unpadded_leaves[i]), rng) for i in diff]

  def on_diff(leaves, *values):
    return jax.tree.unflatten(in_tree, _with(leaves, diff, values))

  ref_tangents = [valid(t, np.shape(unpadded_leaves[i])) for t, i in zip(tangents, diff)]
  ref_leaves = [jnp.asarray(x) for x in unpadded_leaves]
  masked_jvp = lambda: jax.jvp(lambda *v: run(on_diff(padded_leaves, *v), sizes),  # noqa: E731
                               tuple(padded_leaves[i] for i in diff), tuple(tangents))

  def reference_jvp(fun):
    def run_jvp(leaves, ref_tangents):   # every leaf an argument: no constants baked in
      return jax.jvp(lambda *v: fun(*on_diff(leaves, *v)),
                     tuple(leaves[i] for i in diff), tuple(ref_tangents))
    return run_jvp

  ref_tangents = [jnp.asarray(t) for t in ref_tangents]
  fused = _fused_reference(case, jax.tree.unflatten(in_tree, ref_leaves),
                           tangents=ref_tangents)
  try:
    if fused is not None:
      expected, _, expected_t = fused
    else:
      expected, expected_t = _unpadded(
          case,
          lambda: _program(case, "jvp", lambda: reference_jvp(case.fun), in_tree, tuple(diff))(
              ref_leaves, ref_tangents),
          lambda: reference_jvp(_fun(case))(ref_leaves, ref_tangents))
  except Exception:   # JAX refuses forward mode here (a custom_vjp): polyjit too
    with pytest.raises(pj.MaskingError):
      masked_jvp()
    return
  data_dependent = _data_dependent(masked, padded)
  outs, touts = masked_jvp()
  if data_dependent:
    (outs, shapes), (touts, _) = (outs, touts)
    shapes = jax.tree.map(int, shapes)
  else:
    shapes = masked.logical_shapes(padded, sizes)
  for k, (t, e, s) in enumerate(zip(jax.tree.leaves(touts), jax.tree.leaves(expected_t),
                                    _shape_leaves(shapes, expected))):
    t = np.asarray(t)
    if t.dtype == jax.dtypes.float0:
      continue
    what = f"{case.name} jvp sizes={sizes} output {k}"
    np.testing.assert_allclose(valid(t, s), e, rtol=max(case.rtol, 1e-4),
                               atol=max(case.atol, 1e-4), equal_nan=True, err_msg=what)


def _with(leaves, positions, values):
  """`leaves` with those at `positions` replaced by `values`."""
  full = list(leaves)
  for i, v in zip(positions, values, strict=True):
    full[i] = v
  return full


def nan_padded(x, padded):
  """`x` with its leading axis padded to `padded` with NaN (the padding must not matter)."""
  out = np.full((padded,) + x.shape[1:], np.nan, x.dtype)
  out[:x.shape[0]] = x
  return out


def unpad_outputs(outs, shapes):
  """Masked outputs cut to the logical `shapes` that came with them (a pytree of both)."""
  return jax.tree.map(lambda o, s: np.asarray(o)[tuple(slice(0, int(d)) for d in s)],
                      outs, shapes)


def assert_pj_jit_matches_jax_jit(fun, mode, lengths):
  """`pj.jit(fun)` (automatic, or `polymorphic_shapes=["n"]`) on ones of each
  length gives exactly `jax.jit(fun)`'s value; a fallback is allowed."""
  f = pj.jit(fun, polymorphic_shapes=None if mode == "auto" else ["n"])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.FallbackWarning)
    for n in lengths:
      x = np.ones(n, np.float32)
      assert float(f(x)) == float(jax.jit(fun)(x)), (getattr(fun, "__name__", fun), n)
