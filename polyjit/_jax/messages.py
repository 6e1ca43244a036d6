"""Parsers of JAX's texts: cache-miss explanations, compile events, error messages."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from jax._src import config as _config

from .core import InconclusiveDimensionOperation

# --- recompilation explanations ------------------------------------------------

def explain_cache_misses() -> Any:
  """Context manager: JAX logs why each tracing cache miss happened."""
  return _config.explain_cache_misses(True)


def cache_miss_loggers() -> list[str]:
  """The loggers JAX writes its cache-miss explanations to."""
  return ["jax._src.interpreters.partial_eval", "jax._src.pjit", "jax._src.dispatch"]


# An explanation names the function that missed ("never seen function: f id=..
# defined at file:line", or "for f defined at file:line" against the closest
# previous call) and each argument whose type changed
# ("* at x, now f32[7,3] and before f32[5,3]").
_MISS_HEAD = "TRACING CACHE MISS"
_NEVER_SEEN = re.compile(r"never seen function:\s*\n\s*(?P<name>\S+) id=\S+ defined at (?P<where>\S+)")
_SEEN = re.compile(r"\n\s*for (?P<name>\S+) defined at (?P<where>\S+)")
_CHANGE = re.compile(r"\* at (?P<path>.+?), now (?P<now>\S+) and before (?P<before>\S+)")
_AVAL = re.compile(r"^(?P<dtype>[a-z]+[0-9]*)\[(?P<dims>[0-9,]*)\]")


def is_cache_miss_explanation(message: str) -> bool:
  """Whether a log message is one of JAX's cache-miss explanations."""
  return message.startswith(_MISS_HEAD)


@dataclasses.dataclass(frozen=True)
class CacheMiss:
  """What a cache-miss explanation says."""
  function: str            # the function's name
  defined_at: str          # its "file:line"
  never_seen: bool         # the function object is new
  # (argument path, its dims now, its dims before); dims are None when the
  # type is not an array of a known shape
  changes: tuple[tuple[str, list[int] | None, list[int] | None], ...]


def parse_cache_miss(message: str) -> CacheMiss | None:
  """The contents of a cache-miss explanation, or None when the function it
  names cannot be found in it."""
  head = _NEVER_SEEN.search(message) or _SEEN.search(message)
  if head is None:
    return None
  changes = tuple((c.group("path"), _aval_dims(c.group("now")), _aval_dims(c.group("before")))
                  for c in _CHANGE.finditer(message))
  return CacheMiss(head.group("name"), head.group("where"), head.re is _NEVER_SEEN, changes)


def _aval_dims(aval: str) -> list[int] | None:
  """[7, 3] for JAX's text of an array type 'f32[7,3]', else None."""
  match = _AVAL.match(aval)
  if match is None:
    return None
  return [int(d) for d in match.group("dims").split(",") if d]


# --- compile events (`jax.monitoring`) ---------------------------------------------
#
# JAX reports each XLA backend compile as a duration event, tagged with the
# function name; a load from the persistent compilation cache is wrapped by the
# same event, announced just before (in the same thread) by a cache-hit event.

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def compile_event_function(event_kwargs: dict[str, Any]) -> str:
  """The function name a compile event is tagged with ('?' when none)."""
  return str(event_kwargs.get("fun_name", "?"))


def jit_program_name(name: str) -> str:
  """The name compile events give `jax.jit` of a function called `name`."""
  return f"jit({name})"


def function_of_program(program_name: str) -> str:
  """The function name inside a program name 'jit(f)' (others unchanged)."""
  return program_name[4:-1] if program_name.startswith("jit(") else program_name


# --- JAX's error texts -------------------------------------------------------------

_INCONCLUSIVE = re.compile(
    r"comparison '(?P<a>[^']+)' (?P<op>>=|<=|>|<) '(?P<b>[^']+)' is inconclusive")


#: JAX's refusals to trace at a symbolic size: a marker in its message -> the
#: name polyjit gives it (`_refusals.TRACE_REFUSALS`).
_TRACE_REFUSAL_MARKERS = {
    "associative scan over axis of non-constant size": "associative_scan",
    "shape polymorphism for `permutation` or `shuffle`": "permutation",
    # a size evaluated eagerly, under jax.ensure_compile_time_eval()
    "Evaluation rule for 'dim_as_value' is not implemented": "eager_size",
}


def trace_refusal(error: BaseException) -> str | None:
  """Which of JAX's known refusals to trace at a symbolic size `error` is."""
  from .registry import REFUSALS, require  # (the texts are probed at first use)
  require(REFUSALS)
  return trace_refusal_unchecked(error)


def trace_refusal_unchecked(error: BaseException) -> str | None:
  """`trace_refusal` without the probe of the texts (for the probe itself)."""
  text = str(error)
  for marker, name in _TRACE_REFUSAL_MARKERS.items():
    if marker in text:
      return name
  return None


def needs_concrete_size(error: BaseException) -> bool:
  """Whether `error` is Python or JAX needing a plain int where a symbolic
  size was given (`range(n)`, `int(n)`, an inconclusive comparison)."""
  text = str(error)
  return (isinstance(error, TypeError) and (
      "cannot be interpreted as an integer" in text or "DimExpr" in text)
      or isinstance(error, InconclusiveDimensionOperation))


def is_while_loop_vjp_refusal(error: BaseException) -> bool:
  """Whether `error` is JAX refusing to differentiate a while_loop in reverse
  mode (what a loop whose trip count is a symbolic size becomes)."""
  return "Reverse-mode differentiation does not work for lax.while_loop" in str(error)


def inconclusive_comparison(error: BaseException) -> tuple[str, str, str] | None:
  """(a, op, b) of the comparison an InconclusiveDimensionOperation names."""
  match = _INCONCLUSIVE.search(str(error))
  return None if match is None else (match.group("a"), match.group("op"), match.group("b"))


# --- the transfer guard --------------------------------------------------------

_REFUSED_TRANSFER = re.compile(r"Disallowed (host-to-device|device-to-host|device-to-device) transfer")


def transfer_refused(error: BaseException) -> bool:
  """Whether `error` is JAX's transfer guard refusing a transfer (a user
  setting, `jax.transfer_guard("disallow")`: never a reason to fall back)."""
  return _REFUSED_TRANSFER.search(str(error)) is not None
