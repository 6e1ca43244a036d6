"""The coverage table: what `pj.mask` supports, primitive by primitive.

Rows: every primitive JAX exposes in `jax.extend.core.primitives`, plus every
primitive polyjit has a masking rule for. A row's status comes from the code:

* supported: the primitive has a rule in `_core.masking_rules`; its family is
  the rule's module in `polyjit/_rules/`. Adding a rule is all it takes: this
  module lists no supported primitive by name.
* not applicable: it cannot carry padded data in a program `pj.mask` traces
  (tokens, collectives over device axes); the reason is in `REASONS`.
* unsupported: no rule. `REASONS` says why when there is more to say than
  "no rule yet"; a user whose padded operand reaches it gets `MaskingError`
  with that reason (`_core._no_rule_error`).

Some functions never reach a primitive: JAX itself refuses to trace them at a
symbolic size. `TRACE_REFUSALS` turns those refusals into `MaskingError`s
that say what to do (`jax_refusal`, called by `pj.mask` when tracing).

The table also lists what the tests check: every `Case` in the tables of
`tests/test_rules*.py`, traced with symbolic shapes (and its VJP when the case
checks gradients), with the primitives it runs through rules (`exercised`).

    python -m polyjit._coverage --write    # regenerates docs/coverage.md

tests/test_coverage.py fails when docs/coverage.md is out of step with the
code, and when a rule is exercised by no test table.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path

import jax
import jax.extend.core as jex_core
import numpy as np

from . import _jax_compat as jc
from . import _rules  # noqa: F401  (registers the masking rules)
from ._core import eqn_is_symbolic, masking_rules
from ._errors import MaskingError
from ._mask import mask

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

#: JAX's own refusals to trace at a symbolic size: a marker in JAX's message
#: -> (the function, why JAX refuses, what to do).
TRACE_REFUSALS: dict[str, tuple[str, str, str]] = {
    "associative scan over axis of non-constant size": (
        "lax.associative_scan",
        "it builds its tree of combinations from a static length.",
        "scan sequentially with lax.scan, which masks and differentiates; or use "
        "the cumulative primitive when fn is one (lax.cumsum, lax.cumprod, "
        "lax.cummax, lax.cummin, lax.cumlogsumexp); or declare the axis fixed "
        "(\"_\" in the spec)."),
    "shape polymorphism for `permutation` or `shuffle`": (
        "jax.random.permutation",
        "it shuffles with a number of sorting rounds that depends on the size.",
        "shuffle by sorting on random keys, "
        "x[jnp.argsort(jax.random.uniform(key, x.shape))]; or declare the axis "
        "fixed (\"_\" in the spec)."),
}


def why_unsupported(name: str) -> str | None:
  """The reason `name` has no rule, if `REASONS` gives one."""
  entry = REASONS.get(name)
  return entry[1] if entry else None


def jax_refusal(e: NotImplementedError) -> MaskingError:
  """A `MaskingError` for JAX refusing to trace a function at a symbolic size."""
  for marker, (function, why, todo) in TRACE_REFUSALS.items():
    if marker in str(e):
      return MaskingError(f"JAX cannot trace {function} at a dynamic size: {why}\n"
                          f"What to do: {todo}")
  return MaskingError(
      f"JAX cannot trace the masked function with symbolic sizes: {e}\n"
      "What to do: declare the axis involved fixed (\"_\" in the spec, or None "
      "for the whole argument), or compute this step outside the masked function.")


# --- the rows ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Row:
  name: str
  status: str
  note: str    # a supported primitive's rule family, else why it has no rule


def _public_primitive_names() -> set[str]:
  return {p.name for p in vars(jex_core.primitives).values()
          if isinstance(p, jex_core.Primitive)}


def rows() -> list[Row]:
  families = {p.name: rule.__module__.rsplit(".", 1)[-1]
              for p, rule in masking_rules.items()}
  out = []
  for name in sorted(_public_primitive_names() | set(families)):
    if name in families:
      out.append(Row(name, SUPPORTED, families[name]))
    else:
      status, why = REASONS.get(name, (UNSUPPORTED, "no rule yet."))
      out.append(Row(name, status, why))
  return out


# --- what the tests exercise -------------------------------------------------

def exercised(case) -> set[str]:
  """The primitives `case` (a tests/harness.py `Case`) runs through rules.

  Those of its function traced with symbolic shapes, and of its VJP when the
  case checks gradients: every equation with a symbolic size, in sub-jaxprs
  too.
  """
  masked = mask(case.fun, case.in_shapes, constraints=case.constraints)
  traced = masked.trace(case.args(np.random.default_rng(0), case.padded))
  names = _symbolic_primitives(traced.jaxpr)
  if "grad" in case.modes:
    names |= _symbolic_primitives(traced.vjp().traced.jaxpr)
  return names


def _symbolic_primitives(jaxpr: jc.Jaxpr) -> set[str]:
  names = set()
  for eqn in jaxpr.eqns:
    if eqn_is_symbolic(eqn):
      names.add(eqn.primitive.name)
      for sub in jc.subjaxprs_in_params(eqn.params):
        names |= _symbolic_primitives(sub)
  return names


def case_tables(tests_dir: Path) -> dict[str, list]:
  """The `Case`s of each tests/test_rules*.py module, in table order."""
  if str(tests_dir) not in sys.path:
    sys.path.insert(0, str(tests_dir))
  harness = importlib.import_module("harness")
  tables = {}
  for path in sorted(tests_dir.glob("test_rules*.py")):
    module = importlib.import_module(path.stem)
    cases, seen = [], set()
    for value in vars(module).values():
      if isinstance(value, dict):
        value = list(value.values())
      if not isinstance(value, (list, tuple)):
        continue
      for case in value:
        if isinstance(case, harness.Case) and id(case) not in seen:
          seen.add(id(case))
          cases.append(case)
    tables[path.name] = cases
  return tables


# --- the document ------------------------------------------------------------

def render(table_rows: list[Row], tables: dict[str, list[tuple[str, set[str]]]]) -> str:
  """docs/coverage.md: `tables` maps a test module to (case name, primitives)."""
  counts = {s: sum(r.status == s for r in table_rows)
            for s in (SUPPORTED, UNSUPPORTED, NOT_APPLICABLE)}
  lines = [
      "# What `pj.mask` supports",
      "",
      "Generated by `python -m polyjit._coverage --write` from the masking rules "
      "(`polyjit/_rules/`) and the test tables (`tests/test_rules*.py`), for JAX "
      f"{jax.__version__}; `tests/test_coverage.py` fails when it is out of step.",
      "",
      f"**{counts[SUPPORTED]} supported, {counts[UNSUPPORTED]} unsupported, "
      f"{counts[NOT_APPLICABLE]} not applicable**, of {len(table_rows)} primitives: "
      "every primitive in `jax.extend.core.primitives`, and every primitive "
      "polyjit has a rule for.",
      "",
      "A primitive without a rule runs unchanged when none of its operands has a "
      "padded axis. With one, `pj.mask` refuses rather than guess:",
      "",
      "```",
      "polyjit.MaskingError: polyjit cannot mask the primitive 'NAME' at FILE:LINE "
      "(function): it has no masking rule, and its operands have padded axes: ...",
      "What to do: ...",
      "Why it has none: REASON    (the reason below, where one is given)",
      "```",
      "",
      "A supported primitive can still refuse particular parameters (a reshape "
      "that would interleave padding with data, say); its rule's module says "
      "which, and the error says what to do.",
      "",
      "## Primitives",
      "",
      "| primitive | status | rule family, or why it has no rule |",
      "| --- | --- | --- |",
  ]
  lines += [f"| `{r.name}` | {r.status} | {r.note} |" for r in table_rows]
  lines += [
      "",
      "## Functions JAX cannot trace at a dynamic size",
      "",
      "JAX refuses these before any rule runs; `pj.mask` turns the refusal into "
      "a `MaskingError` that says what to do.",
      "",
      "| function | why | what to do |",
      "| --- | --- | --- |",
  ]
  lines += [f"| `{fn}` | {why} | {todo} |" for fn, why, todo in TRACE_REFUSALS.values()]
  lines += [
      "",
      "## What the tests check",
      "",
      "Each row of the test tables runs eagerly, under `jit`, under `vmap` over "
      "different logical sizes and under `grad` (unless the test says otherwise), "
      "with NaN and inf in the padding, against the unpadded function. Next to "
      "each row: the primitives with a padded operand it runs through rules (its "
      "function's and, when it checks gradients, its VJP's).",
  ]
  for module, cases in tables.items():
    lines += ["", f"### {module}", "", "| case | primitives |", "| --- | --- |"]
    lines += [f"| `{name}` | {', '.join(sorted(prims))} |" for name, prims in cases]
  return "\n".join(lines) + "\n"


def repo_paths() -> tuple[Path, Path]:
  """(tests directory, docs/coverage.md) of the source checkout."""
  root = Path(__file__).resolve().parent.parent
  return root / "tests", root / "docs" / "coverage.md"


def document(tests_dir: Path) -> str:
  tables = {module: [(case.name, exercised(case)) for case in cases]
            for module, cases in case_tables(tests_dir).items()}
  return render(rows(), tables)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m polyjit._coverage",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--write", action="store_true",
                      help="write docs/coverage.md (default: print it)")
  args = parser.parse_args(argv)
  tests_dir, doc = repo_paths()
  text = document(tests_dir)
  if args.write:
    doc.parent.mkdir(exist_ok=True)
    doc.write_text(text)
    print(f"wrote {doc}")
  else:
    sys.stdout.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
