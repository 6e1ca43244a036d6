"""Exception types and the long messages that explain them.

Every error polyjit raises says what happened, where (the argument, axis or
primitive, and the user's source line), and what to do about it.
"""

from __future__ import annotations

import re
import warnings

from .. import _jax as jc


class PolyjitError(Exception):
  """Base class of polyjit's errors.

  Attributes:
    one_side: raised for sizes on one side of a size comparison where `fun`
      fails (`lax.top_k(x, 3)` at n <= 2), while other sizes still mask.
    exclude_with: with traced sizes, the constraint that excludes the sizes
      where `fun` fails ('n >= 3'), or None.
  """

  one_side: bool = False
  exclude_with: str | None = None


class ShapeError(PolyjitError, ValueError):
  """Shapes or sizes that do not fit the declared polymorphic specs."""


class MaskingError(PolyjitError, NotImplementedError):
  """A computation polyjit cannot run exactly on padded arrays.

  Attributes:
    primitive: the name of the JAX primitive that could not be masked.
    source: the user's source line that emitted it.
  """

  def __init__(self, message: str, *, primitive: str | None = None,
               source: str | None = None) -> None:
    super().__init__(message)
    self.primitive = primitive
    self.source = source


def no_rule_message(prim_name: str, source: str, padded: list[str]) -> str:
  padded_txt = "; ".join(padded) if padded else "(sizes in its parameters)"
  return (
      f"polyjit cannot mask the primitive '{prim_name}' {source}: it has no "
      f"masking rule, and its operands have padded axes: {padded_txt}.\n"
      "Running it on padded data could let padding change the result, so "
      "polyjit refuses instead of guessing.\n"
      "What to do: declare the affected axes with a fixed size (\"_\" in the spec, "
      "or None for the whole argument) if they do not really vary; or compute this "
      "step outside the masked function; or use pj.jit, whose automatic mode "
      "falls back to exact shapes. The documentation's page \"What pj.mask supports\" lists "
      "what is supported.")


def trace_error(error: BaseException, fun_name: str) -> PolyjitError:
  """JAX's error from tracing `fun` with symbolic sizes, as a polyjit error
  that names the user's line (and the JAX function that failed, if one did)
  and says what to do."""
  where, inside = jc.user_line_of(error), jc.library_function_of(error)
  at = (f" in `{inside}`" if inside else "") + (f" (called at {where})" if where else "")
  text = f"{type(error).__name__}: {error}".strip()
  head = f"polyjit cannot trace {fun_name} with dynamic sizes{at}: {text}\n"
  fixed = "declare the axis fixed (\"_\" in the spec, or None for the whole argument)"
  cmp = jc.inconclusive_comparison(error)
  if cmp is not None:
    a, op, b = cmp
    # (JAX asks `size < k` where True raises and `size >= k` where True runs:
    # which side the function needs is not known here, so both are named)
    holds, fails = {">=": (f"{a} >= {b}", f"{a} <= {b} - 1"),
                    ">": (f"{a} >= {b} + 1", f"{a} <= {b}"),
                    "<=": (f"{a} <= {b}", f"{a} >= {b} + 1"),
                    "<": (f"{a} <= {b} - 1", f"{a} >= {b}")}[op]
    return ShapeError(
        head + "JAX needs to know how these sizes compare, and nothing says.\n"
        f"What to do: declare the side your sizes are always on: constraints=['{fails}'] "
        f"or constraints=['{holds}'] (pj.mask, pj.jit; a function that needs at least k "
        f"elements needs 'size >= k'); or {fixed}. pj.jit, and pj.mask called with "
        "concrete sizes, add such a bound themselves when the sizes of the call satisfy it.")
  bounded = _MIN_WITH_CONSTANT.search(text)
  if bounded is not None and "incompatible shapes" in text:
    k, var = (bounded.group(1), bounded.group(2)) if bounded.group(1) else (
        bounded.group(4), bounded.group(3))
    return ShapeError(
        head + f"A slice of a fixed-size array to a dynamic size has size min({k}, {var}), "
        f"which JAX cannot prove equal to {var}.\nWhat to do: declare that {var} never "
        f"exceeds {k}: constraints=[\"{var} <= {k}\"] (pj.jit, pj.mask); or {fixed}.")
  concrete_needed = jc.needs_concrete_size(error)
  user = jc.static_size_user(error) if concrete_needed else None
  if user is not None:
    return ShapeError(head + f"`{user}` {_STATIC_SIZE_ADVICE[user]}; or {fixed}.")
  if concrete_needed and inside is None:
    return ShapeError(
        head + "a dynamic size was used where Python needs a plain int.\nWhat to do: "
        "loop with lax.fori_loop or lax.scan instead of a Python loop over "
        "range(x.shape[0]) or range(len(x)); pass sizes to jnp functions as "
        "x.shape[i] or len(x), not int(...) (a reference to `len` bound before the "
        f"trace, `_len = len`, gets no size: write x.shape[0]); or {fixed}.")
  if concrete_needed:
    return MaskingError(
        head + f"`{inside}` needs this size as a plain int, which a dynamic size is not.\n"
        f"What to do: {fixed}; or compute this step outside the masked function "
        "(see the documentation's \"Common pitfalls\" page).")
  return MaskingError(
      head + f"What to do: {fixed}; add constraints=[...] if JAX needs a bound on a "
      "size; or compute this step outside the masked function (see the documentation's \"Common "
      "pitfalls\" page).")


#: `min(16, n)` or `min(n, 16)` in JAX's message: a constant array sliced to a size.
_MIN_WITH_CONSTANT = re.compile(r"min\((\d+), ([A-Za-z_]\w*)\)|min\(([A-Za-z_]\w*), (\d+)\)")


_STATIC_SIZE_ADVICE = {
    "lax.scan": (
        "needs `length=` as a plain int, which a dynamic size is not.\n"
        "What to do: let the length come from the scanned arrays instead: pass "
        "`xs` with the dynamic axis first (`lax.scan(f, init, x)`, or "
        "`lax.scan(f, init, jnp.arange(x.shape[0]))` for a counter), or use "
        "`lax.fori_loop(0, x.shape[0], body, init)`, which polyjit runs as such a scan"),
    "lax.reduce": (
        "with a custom reducer has a derivative that JAX builds for a plain-int "
        "length, which a dynamic size is not.\n"
        "What to do: use the jnp reduction if there is one (jnp.sum, jnp.prod, "
        "jnp.max, jnp.min, jax.nn.logsumexp), or fold "
        "with `lax.scan(lambda c, v: (reducer(c, v), None), init, x)[0]`, which "
        "differentiates at every length"),
}


def expression_too_large(text: str, where: str) -> MaskingError:
  """A size comparison too large to decide (`_jax/decisions.py`)."""
  return MaskingError(
      f"polyjit stops at the size comparison {text[:160]}{'...' if len(text) > 160 else ''} "
      f"at {where}: its sizes are expressions of {len(text)} characters, grown by "
      "computing sizes from sizes again and again (recursion that splits a size, "
      "`x[:n // 2]` and `x[n // 2:]`, doubles them per level), and JAX's decision "
      "procedure takes time exponential in them.\nWhat to do: declare the axis fixed "
      "(polymorphic_shapes with '_'), or use pj.jit without polymorphic_shapes (its "
      "automatic mode compiles such shapes exactly), or write the recursion as a loop "
      "over arrays of a fixed size (lax.fori_loop, lax.while_loop).")


class SizeValueError(ShapeError, MaskingError, TypeError):
  """A symbolic size was asked for its Python value (`int(n)`, `range(n)`):
  one trace serves many sizes, so it has none. A `ShapeError` (what polyjit
  raised for it before), and a `TypeError`, as JAX's own refusal of
  `operator.index` on a symbolic dimension is."""


class CompileLimitError(PolyjitError, RuntimeError):
  """A function compiled more often than `pj.assert_max_compiles` allows."""


class PolyjitWarning(UserWarning):
  """Base class of polyjit's warnings (filter them with `warnings.filterwarnings`)."""


class FallbackWarning(PolyjitWarning):
  """`pj.jit` compiles every distinct shape exactly because it cannot mask."""


class PerformanceWarning(PolyjitWarning):
  """A computation polyjit runs exactly but slowly, and why: for example the
  gradient of an input every example of a batch shares, built once per
  example because the masked function cannot be differentiated natively."""


class CacheWarning(PolyjitWarning):
  """polyjit's on-disk cache cannot be used (a read-only or full disk): it is off."""


def warn_user(message: str, category: type[Warning]) -> None:
  """`warnings.warn`, attributed to the user's line that called into polyjit."""
  warnings.warn(message, category, stacklevel=jc.stacklevel_outside_polyjit())


def warn_user_code(message: str, category: type[Warning]) -> None:
  """`warnings.warn`, attributed to the first line of user code on the stack
  (past JAX's frames: for warnings raised inside a transformation's rule)."""
  warnings.warn(message, category, stacklevel=jc.stacklevel_at_user_code())
