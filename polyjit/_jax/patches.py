"""The permanent patches polyjit installs on JAX's tables and classes.

`install_patches()` (at import) first runs the probes of every internal of
kind "patch" and of what every trace reads (`probes.py`): on a JAX where one
fails it raises `JaxBoundaryError` with nothing installed. Then it installs,
and records each target in `INSTALLED`, the registry of what is patched (one
row each: target, why). The wrappers below refuse, rather than skip, a target
that is not as probed, so no patch is ever half-installed. Per-trace swaps of
public functions are not here: see `swaps.py`.
"""
from __future__ import annotations

import functools
import importlib
import threading
from typing import Any, Callable

import jax
from jax._src import core as _core
from jax._src import source_info_util as _siu
from jax._src.interpreters import ad as _ad

from .decisions import _install_decision_hooks
from .frames import _POLYJIT_DIR
from .primitives import primitive
from .probes import WRAPPED_JVPS, WRAPPED_TRANSPOSES
from .registry import DECISIONS, DIMS, JAXPRS, SOURCE, TEXTS, require, require_kind

# --- differentiation rules ---------------------------------------------------

def wrap_jvp_rule(name: str, rule: Callable[..., Any]) -> None:
  """Installs `rule(original, primals, tangents, **params)` as `name`'s JVP.

  The rule receives JAX's own JVP rule as `original` and must defer to it
  except where it adds support (see `_masking/autodiff.py`). Idempotent.
  """
  prim = primitive(name)
  if prim is None or prim not in _ad.primitive_jvps or name not in WRAPPED_JVPS:
    raise LookupError(f"no JVP rule of {name!r} to wrap, or it is not probed "
                      "(WRAPPED_JVPS)")
  original = _ad.primitive_jvps[prim]
  if getattr(original, "_polyjit_wrapped", False):
    return
  wrapped = functools.partial(rule, original)
  setattr(wrapped, "_polyjit_wrapped", True)
  _ad.primitive_jvps[prim] = wrapped
  INSTALLED.append((f"ad.primitive_jvps[{name}]", "JVP at symbolic sizes"))


def wrap_transpose_rules(name: str, wrap: Callable[[int, Any], Any]) -> None:
  """Wraps the rule functions behind `name`'s transpose.

  JAX stores a linear or bilinear primitive's transpose as
  `functools.partial(driver, *rules)` (one rule for `deflinear2`, the lhs and
  rhs rules for `defbilinear`, in two tables). Each rule is replaced by
  `wrap(i, rule)`, which must defer to `rule` except where it adds support
  (see `_masking/rules/windows.py`, `_masking/rules/fft.py`). Idempotent.
  """
  prim = primitive(name)
  if prim is None or name not in WRAPPED_TRANSPOSES:
    raise LookupError(f"no primitive {name!r}, or its transpose is not probed "
                      "(probes.WRAPPED_TRANSPOSES)")
  for table in (_ad.primitive_transposes, getattr(_ad, "fancy_transposes", {})):
    entry = table.get(prim)
    if not isinstance(entry, functools.partial) or getattr(entry, "_polyjit_wrapped", False):
      continue
    rules = [wrap(i, rule) for i, rule in enumerate(entry.args)]
    wrapped = functools.partial(entry.func, *rules, **entry.keywords)
    setattr(wrapped, "_polyjit_wrapped", True)
    table[prim] = wrapped
    INSTALLED.append((f"ad transpose table[{name}]", "transpose at symbolic sizes"))


def instantiate_zeros(t: Any, like: Any) -> Any:
  """A tangent as an array: symbolic zeros become zeros shaped like `like`."""
  # `ad.Zero` is re-exported by JAX implicitly, and primal_dtype_to_tangent_dtype
  # is unannotated (stub gaps).
  if isinstance(t, _ad.Zero):  # type: ignore[attr-defined, unused-ignore]
    return jax.numpy.zeros(
        like.shape,
        _core.primal_dtype_to_tangent_dtype(like.dtype))  # type: ignore[no-untyped-call, unused-ignore]
  return t


def is_zero_tangent(t: Any) -> bool:
  """Whether a tangent is JAX's symbolic zero."""
  # `ad.Zero` is re-exported by JAX implicitly (a stub gap).
  return isinstance(t, _ad.Zero)  # type: ignore[attr-defined, unused-ignore]


#: The private `jax.custom_jvp` functions whose JVP polyjit wraps, by the
#: public function they implement.
CUSTOM_JVP_TARGETS = {"jnp.linalg.det": ("jax._src.numpy.linalg", "_det")}


def wrap_custom_jvp_rule(public_name: str, rule: Callable[..., Any]) -> None:
  """Installs `rule(original, primals, tangents)` as the JVP of the private
  `jax.custom_jvp` function behind `public_name` (`CUSTOM_JVP_TARGETS`).

  Like `wrap_jvp_rule`: the rule defers to `original` except where it adds
  support. Idempotent; refuses a target that is not a `jax.custom_jvp`.
  """
  module, name = CUSTOM_JVP_TARGETS[public_name]
  fn = getattr(importlib.import_module(module), name, None)
  if not isinstance(fn, jax.custom_jvp):
    raise LookupError(f"{module}.{name} is not a jax.custom_jvp")
  if getattr(fn.jvp, "_polyjit_wrapped", False):
    return
  wrapped = functools.partial(rule, fn.jvp)
  setattr(wrapped, "_polyjit_wrapped", True)
  fn.jvp = wrapped
  INSTALLED.append((f"{module}.{name}.jvp", f"JVP of {public_name} at symbolic sizes"))


# --- installing the patches ---------------------------------------------------

_patches_lock = threading.Lock()
_patches_installed = False
#: What is patched, in order: (target, why).
INSTALLED: list[tuple[str, str]] = []


def install_patches(*rule_installers: Callable[[], None]) -> None:
  """Installs every change polyjit makes to JAX's tables and classes, once
  (later calls do nothing). Called when polyjit is imported, from `_masking/mask.py`.

  * polyjit's frames are left out of JAX's source lines
    (`source_info_util.register_exclusion`);
  * the size-decision hooks: `DimExpr.__eq__` and `shape_poly._geq_decision`
    ask the oracle of `size_decisions()` about user code's comparisons (and
    behave as JAX's own outside such a block);
  * `rule_installers`, polyjit's differentiation rules (`_masking/autodiff.py`'s
    `install`, which lists every JVP and transpose polyjit replaces), each calling
    `wrap_jvp_rule`, `wrap_transpose_rules` or `wrap_custom_jvp_rule`; they are
    passed in so that this module imports nothing of polyjit's.

  Not installed here, by design: the spelling replacements of
  `trace_spellings()` are put in place for each symbolic trace and removed
  after it (see below), since they replace public JAX functions.
  """
  global _patches_installed
  with _patches_lock:
    if _patches_installed:
      return
    require_kind("patch")  # before anything is installed
    for feature in (DIMS, JAXPRS, SOURCE, DECISIONS, TEXTS):
      require(feature)
    _siu.register_exclusion(_POLYJIT_DIR)
    INSTALLED.append(("source_info_util exclusions", "polyjit's frames are not user frames"))
    _install_decision_hooks()
    INSTALLED.append(("shape_poly._DimExpr.__eq__", "size equalities asked by user code"))
    INSTALLED.append(("shape_poly._geq_decision", "size inequalities asked by user code"))
    INSTALLED.append(("shape_poly._DimExpr.__class__", "a size is an int to user code's isinstance"))
    for install in rule_installers:
      install()
    _patches_installed = True
