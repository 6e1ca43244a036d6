"""What polyjit relies on in JAX: one row per internal, each with a probe.

polyjit does not pin JAX's version. Instead every JAX internal it uses (a
private module attribute, a table it patches, a function it swaps during a
trace, a text of JAX's it parses) is a row of `ROWS`: what it is, the polyjit
feature that needs it, why, how it is changed (`kind`), the JAX versions it
was audited in (docs/jax-boundary.md), and a probe: a cheap check that it
exists, has the expected signature and behaves as assumed on a tiny case.

Probes run once. Those of permanent patches run before `install_patches()`
changes anything (at import), so a JAX where one fails gets no patch at all;
the others run at the first use of their feature (`require(feature)`). A
failing probe raises `JaxBoundaryError`, naming the feature, the internal, the
installed JAX and the newest tested one: polyjit never computes with a
half-working patch. This module imports nothing (the probes live in
`probes.py`, which registers them here).
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable

import jax

#: The JAX polyjit's whole test suite runs on, and the versions audited.
NEWEST_TESTED = "0.10.2"
TESTED = ("0.10.2 (full suite)", "0.12.0.1 (full suite on Python 3.13, less tests/known_failures_newest_jax.txt)",
          "0.9.2 (tests/test_old_jax.py subset)")
AUDITED = ("0.9.2", "0.10.2", "0.11.0", "main at cec06d1 (2026-08-08)")


# The features that rely on JAX internals (each internal's row names one).
DECISIONS = "size comparisons in user code"
SOURCE = "source lines"
AD = "differentiation rules"
DIMS = "symbolic dimensions"
JAXPRS = "jaxpr interpretation"
SWAPS = "exact spellings during traces"
CALL = "the call path"
SIZES = "data-dependent sizes"
TEXTS = "explanations of JAX's errors"
REFUSALS = "explanations of JAX's refusals"
PROGRAMS = "the on-disk programs"
INLINE = "small CPU programs on the calling thread"


class JaxBoundaryError(RuntimeError):
  """The installed JAX lacks (or changed) an internal a polyjit feature needs."""


@dataclasses.dataclass(frozen=True)
class Internal:
  name: str                    # the internal, as `module.attribute` or a description
  feature: str                 # the polyjit feature that needs it
  kind: str                    # "patch" (permanent), "swap" (per trace), "read", "text"
  why: str                     # what polyjit does with it
  probe: Callable[[], None]    # raises (or asserts) when it does not hold
  versions: str                # the JAX versions where the audit found it as used


ROWS: dict[str, Internal] = {}
KINDS = ("patch", "swap", "read", "text")
_passed: set[str] = set()
_running: set[str] = set()   # probes under way (a probe that uses its own feature)
_lock = threading.RLock()  # (a probe may use a feature whose first use checks it)
# The probes that passed in an earlier process on the same JAX, jaxlib, Python
# and polyjit files (`_caching/probe_memo.py`, where polyjit's disk cache is
# on): `load` gives their names (None: not known yet, ask again), `save` keeps
# them. A second process then skips them (the programs probe lowers a program
# of its own: 6-17 ms of a second process's first call, measured at load 3-8).
_memo: dict[str, Callable[..., Any] | None] = {"load": None, "save": None}
_remembered: set[str] | None = None   # (loaded at the first check)


def internal(name: str, feature: str, kind: str, why: str,
             versions: str = "0.9.2, 0.10.2, 0.11.0, main (cec06d1)"
             ) -> Callable[[Callable[[], None]], Callable[[], None]]:
  """Decorator: registers the decorated function as the probe of `name`,
  found as used in JAX `versions` (the audit, docs/jax-boundary.md)."""
  if kind not in KINDS:
    raise ValueError(f"unknown kind {kind!r}")

  def register(probe: Callable[[], None]) -> Callable[[], None]:
    if name in ROWS:
      raise ValueError(f"internal {name!r} registered twice")
    ROWS[name] = Internal(name, feature, kind, why, probe, versions)
    return probe
  return register


def _error(row: Internal, cause: BaseException) -> JaxBoundaryError:
  return JaxBoundaryError(
      f"polyjit's {row.feature} needs JAX's {row.name} ({row.why}), which the installed "
      f"JAX {jax.__version__} lacks or changed: {type(cause).__name__}: {cause}. "
      f"polyjit is tested with JAX {NEWEST_TESTED} (audited: {', '.join(AUDITED)}). "
      "What to do: install a tested JAX (pip install 'jax==" + NEWEST_TESTED + "'), "
      "or report this at polyjit's issue tracker with the message above.")


def check(rows: list[Internal]) -> None:
  """Runs the probes of `rows` not yet passed; the first failure raises
  `JaxBoundaryError` (after all are run, so nothing is half-checked)."""
  todo = [r for r in rows if r.name not in _passed]
  if not todo:
    return
  with _lock:
    failures = []
    remembered = _remembered_passes()
    ran = False
    for row in todo:
      if row.name in _passed or row.name in _running:
        continue
      if row.name in remembered:   # passed in an earlier process on these very files
        _passed.add(row.name)
        continue
      ran = True
      _running.add(row.name)
      try:
        with _tested_settings():
          row.probe()
      except Exception as e:
        failures.append((row, e))
        continue
      finally:
        _running.discard(row.name)
      _passed.add(row.name)
    save = _memo["save"]
    if ran and save is not None:
      try:
        save(remembered | _passed)
      except Exception:  # noqa: BLE001  (a memo not written: the probes run next time)
        pass
    if failures:
      row, cause = failures[0]
      raise _error(row, cause) from cause


@contextlib.contextmanager
def _tested_settings():  # type: ignore[no-untyped-def]
  """The settings the probes are written for, whatever the user's are: no
  transfer guard, no default device, no x64. A probe checks that JAX has an
  internal and behaves as assumed; a user's setting (`jax.transfer_guard
  ("disallow")` refusing a probe's tiny transfer, say) must not read as a JAX
  that changed (a `JaxBoundaryError`, and the feature turned off)."""
  with contextlib.ExitStack() as stack:
    stack.enter_context(jax.transfer_guard("allow"))
    stack.enter_context(jax.default_device(None))
    if jax.config.jax_enable_x64:  # type: ignore[attr-defined, unused-ignore]
      stack.enter_context(jax.enable_x64(False))
    yield


def require(feature: str) -> None:
  """Checks every internal `feature` relies on (once; cheap after that)."""
  rows = [r for r in ROWS.values() if r.feature == feature]
  if not rows:
    raise KeyError(f"no internal is registered for the feature {feature!r}")
  check(rows)


def require_kind(kind: str) -> None:
  """Checks every internal of a kind ("patch": before installing any)."""
  check([r for r in ROWS.values() if r.kind == kind])


def use_memo(load: Callable[[], set[str] | None], save: Callable[[set[str]], None]) -> None:
  """Where the probes that passed are kept across processes (`_memo`)."""
  _memo.update(load=load, save=save)


def _remembered_passes() -> set[str]:
  global _remembered
  load = _memo["load"]
  if _remembered is None:
    if load is None:   # (not yet registered: the probes run at import run)
      return set()
    try:
      found = load()
    except Exception:  # noqa: BLE001  (an unreadable memo: the probes run)
      found = set()
    if found is None:  # (not yet known: asked again at the next check)
      return set()
    _remembered = set(found)
  return _remembered


def forget() -> None:
  """Forgets which probes passed, so they run again (for tests), in this
  process whatever an earlier one found."""
  global _remembered
  with _lock:
    _passed.clear()
    _remembered = set()
