"""`pj.jit`'s keyword arguments, defined once.

`JitOptions` names every keyword `pj.jit` takes and gives its type. `pj.jit`
(both overloads and the function), `JitFunction` and `pj.filter_jit` take
`**options: Unpack[JitOptions]`, so a type checker holds every call to this
one definition (a misspelt keyword or a wrong type is an error there), and
`pj.jit`'s docstring documents them. At run time `check` refuses unknown
keywords, as Python would for a written-out signature, and the options
`pj.jit` cannot honour (`device`, `backend`, `compiler_options`), saying why.
Each default is given once, in `DEFAULTS`; `signature` turns both into the
`inspect.Signature` that `pj.jit` and `pj.filter_jit` show (`help`, IDEs).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence, TypedDict

from .._buckets.fixed import PerDimBucketSpec
from .._masking.spec import ArgSpecs
from .args import refuse_jit_options


class JitOptions(TypedDict, total=False):
  """`pj.jit`'s keyword arguments (see `pj.jit` for what each does)."""
  polymorphic_shapes: ArgSpecs | None
  buckets: PerDimBucketSpec
  constraints: Sequence[str]
  static_argnums: int | Sequence[int] | None
  static_argnames: str | Sequence[str] | None
  donate_argnums: int | Sequence[int] | None
  donate_argnames: str | Sequence[str] | None
  cache_size: int
  background_compile: bool
  fallback: str
  in_shardings: Any
  out_shardings: Any
  keep_unused: bool
  inline: bool
  device: Any
  backend: str | None
  compiler_options: dict[str, Any] | None


#: Each option's default, read wherever the option is (`default`).
DEFAULTS: dict[str, Any] = {
    "polymorphic_shapes": None, "buckets": None, "constraints": (), "static_argnums": None,
    "static_argnames": None, "donate_argnums": None, "donate_argnames": None,
    "cache_size": 64, "background_compile": False, "fallback": "warn", "in_shardings": None,
    "out_shardings": None, "keep_unused": False, "inline": False, "device": None,
    "backend": None, "compiler_options": None}
assert set(DEFAULTS) == set(JitOptions.__annotations__)

FALLBACKS = ("warn", "error", "silent")


def default(options: JitOptions, name: str) -> Any:
  """The option's value, or its default."""
  return options.get(name, DEFAULTS[name])


def with_signature(fn: Callable[..., Any], *leading: inspect.Parameter,
                   taken: Sequence[str] = ()) -> None:
  """Gives `fn` (which takes `**options`) the signature a written-out keyword
  list would have: `leading`, then every option but those `fn` sets itself
  (`taken`) as keyword-only with its default and type; the return type is
  `fn`'s own."""
  # (TypedDict keeps postponed annotations as ForwardRefs: shown as their text)
  types = {k: getattr(t, "__forward_arg__", t) for k, t in JitOptions.__annotations__.items()}
  params = [*leading, *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value,
                                          annotation=types[name])
                        for name, value in DEFAULTS.items() if name not in taken)]
  returns = inspect.signature(fn).return_annotation
  setattr(fn, "__signature__", inspect.Signature(params, return_annotation=returns))


def check(options: JitOptions, what: str = "pj.jit") -> None:
  """Raises for a keyword `pj.jit` does not take, or cannot honour."""
  unknown = sorted(set(options) - set(JitOptions.__annotations__))
  if unknown:
    raise TypeError(f"{what} got an unexpected keyword argument {unknown[0]!r}")
  refuse_jit_options(device=options.get("device"), backend=options.get("backend"),
                     compiler_options=options.get("compiler_options"))
  fallback = default(options, "fallback")
  if fallback not in FALLBACKS:
    raise ValueError(f"fallback must be 'warn', 'error' or 'silent', got {fallback!r}")
