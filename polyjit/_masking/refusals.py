"""Why polyjit refuses: the reasons a primitive has no rule, and JAX's own
refusals to trace at a symbolic size, turned into errors that say what to do.

The coverage table (docs/coverage.md, rendered by tools/coverage.py) lists
these tables; the runtime reads them here (`_core` for primitives without a
rule, `_mask` when tracing fails).
"""

from __future__ import annotations

from typing import Any, Sequence

from .. import _jax as jc
from .errors import MaskingError

SUPPORTED = "supported"
UNSUPPORTED = "unsupported"
NOT_APPLICABLE = "n/a"

_COLLECTIVE = (NOT_APPLICABLE, "a collective over a named device axis (`shard_map`, "
               "`pmap`): it moves data between devices, which `pj.mask` does not do.")
_TOKEN = (NOT_APPLICABLE, "orders effects with tokens; it carries no array data.")
_REF = (UNSUPPORTED, "reads or writes a mutable array ref (`jax.new_ref`, "
        "`run_state`); an index into a padded ref would need the clamping "
        "`dynamic_slice` gets, and no rule does that yet.")

#: Why a primitive has no rule, when there is more to say than "not yet":
#: name -> (NOT_APPLICABLE or UNSUPPORTED, reason).
REASONS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("all_gather", "all_to_all", "axis_index", "pmax", "pmin",
                     "ppermute", "psum", "ragged_all_to_all"), _COLLECTIVE),
    **dict.fromkeys(("after_all", "create_token"), _TOKEN),
    **dict.fromkeys(("get", "swap"), _REF),
    "custom_lin": (NOT_APPLICABLE, "internal to JAX's linearization; it never "
                   "appears in a program `pj.mask` traces."),
    "rng_bit_generator": (UNSUPPORTED, "XLA's RngBitGenerator lays its values out "
                          "over the shape as the backend chooses, so a padded draw "
                          "need not contain the unpadded one. Use `jax.random` with "
                          "a threefry or philox key, which masks exactly."),
    "rng_uniform": (UNSUPPORTED, "XLA's stateful RngUniform: its values depend on "
                    "the backend and on the shape. Use `jax.random`."),
}

#: JAX's own refusals to trace at a symbolic size, by the name
#: `jc.trace_refusal` gives them (it reads JAX's message) -> (the function,
#: why JAX refuses, what to do).
TRACE_REFUSALS: dict[str, tuple[str, str, str]] = {
    "associative_scan": (
        "lax.associative_scan",
        "it builds its tree of combinations from a static length (polyjit swaps in an "
        "exact replacement for `lax.associative_scan` while it traces; this is a "
        "reference taken before, `from jax.lax import associative_scan`).",
        "call it as jax.lax.associative_scan; or scan sequentially with lax.scan, "
        "which masks and differentiates; or use "
        "the cumulative primitive when fn is one (lax.cumsum, lax.cumprod, "
        "lax.cummax, lax.cummin, lax.cumlogsumexp); or declare the axis fixed "
        "(\"_\" in the spec)."),
    "permutation": (
        "jax.random.permutation",
        "it shuffles with a number of sorting rounds that depends on the size.",
        "shuffle by sorting on random keys, "
        "x[jnp.argsort(jax.random.uniform(key, x.shape))]; or declare the axis "
        "fixed (\"_\" in the spec)."),
    "eager_size": (
        "code under jax.ensure_compile_time_eval()",
        "it evaluates eagerly, and a dynamic size has no concrete value. (Blocks "
        "entered as `jax.ensure_compile_time_eval()` while polyjit traces, NumPyro's "
        "validation among them, stage what needs a size; this one was entered through "
        "a reference taken before the trace, or JAX's internal one.)",
        "enter it as `jax.ensure_compile_time_eval()`; or move the eager step outside "
        "the masked function; or declare the axis fixed (\"_\" in the spec)."),
}


def why_unsupported(name: str) -> str | None:
  """The reason `name` has no rule, if `REASONS` gives one."""
  entry = REASONS.get(name)
  return entry[1] if entry else None


def jax_refusal(e: NotImplementedError) -> MaskingError:
  """A `MaskingError` for JAX refusing to trace a function at a symbolic size."""
  refusal = jc.trace_refusal(e)
  if refusal in TRACE_REFUSALS:
    function, why, todo = TRACE_REFUSALS[refusal]
    return MaskingError(f"JAX cannot trace {function} at a dynamic size: {why}\n"
                        f"What to do: {todo}")
  return MaskingError(
      f"JAX cannot trace the masked function with symbolic sizes: {e}\n"
      "What to do: declare the axis involved fixed (\"_\" in the spec, or None "
      "for the whole argument), or compute this step outside the masked function.")


def narrowed_output(eqn: jc.JaxprEqn, outs: Sequence[Any]) -> tuple[Any, Any] | None:
  """(the dtype a rule made, the equation's) where they differ, or None.

  With x64 off, a jaxpr traced at a float64 `jax.Array` (made under
  `jax.enable_x64()`) holds float64 values, as jax.jit's does
  (`jc.make_closed_jaxpr`); a rule that builds a value with JAX's functions
  makes float32 there (they canonicalize every dtype they are given), and
  would silently compute in float32 where jax.jit computes in float64."""
  for v, o in zip(eqn.outvars, outs, strict=True):
    want = getattr(v.aval, "dtype", None)
    got = getattr(o, "dtype", want)
    if got != want and jc.uncanonical(want):
      return got, want
  return None


def narrowed_input(eqn: jc.JaxprEqn) -> tuple[Any, Any] | None:
  """(the canonical dtype, an operand's) for the first operand of a dtype that
  this x64 mode does not make, or None: a rule that fails on such operands
  (`narrowed_output`) says why."""
  for v in eqn.invars:
    dtype = getattr(v.aval, "dtype", None)
    if jc.uncanonical(dtype):
      return jc.canonical_dtype(dtype), dtype
  return None


def narrowed_error(eqn: jc.JaxprEqn, got: Any, want: Any) -> MaskingError:
  source = jc.source_line(eqn)
  return MaskingError(
      f"polyjit's rule for '{eqn.primitive.name}' {source} computes in {got} where "
      f"jax.jit computes in {want}: its operands hold {want} values while "
      "jax_enable_x64 is off (an array made under jax.enable_x64()), and the rule "
      "cannot make such values with x64 off.\nWhat to do: convert that array "
      f"(x.astype(jnp.{got})) before the call, or set jax_enable_x64 for the whole "
      "program.", primitive=eqn.primitive.name, source=source)
