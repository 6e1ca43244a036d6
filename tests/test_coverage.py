"""docs/coverage.md is in step with the code, every rule has a test row, and
the rule table refuses names that match no primitive.

The coverage table is rendered by tools/coverage.py from the masking rules
and the test tables of tests/test_rules*.py, which this module reads. Whoever
adds a rule, a reason or a test row regenerates it:

    .venv/bin/python tools/coverage.py --write

which runs test_the_coverage_doc_is_up_to_date with POLYJIT_COVERAGE_OUT set:
the test then writes the document to that file instead of comparing.
"""

from __future__ import annotations

import difflib
import importlib
import os
from pathlib import Path

import jax.extend.core as jex_core
import numpy as np
import jax
import pytest
from harness import Case
from jax import lax

import polyjit as pj
from polyjit._masking.core import masking_rules, register, registered_names, rule_layers
from polyjit._masking.data_dependent import checked_nonempty_reduction
from polyjit._masking.refusals import NOT_APPLICABLE, REASONS, SUPPORTED, UNSUPPORTED
from tools import coverage

REGENERATE = f".venv/bin/{coverage.REGENERATE}"


def case_tables() -> dict[str, list[Case]]:
  """The `Case`s of each tests/test_rules*.py module, in table order."""
  tables = {}
  for path in sorted(Path(__file__).parent.glob("test_rules*.py")):
    module = importlib.import_module(path.stem)
    cases, seen = [], set()
    for value in vars(module).values():
      if isinstance(value, dict):
        value = list(value.values())
      if not isinstance(value, (list, tuple)):
        continue
      for case in value:
        if isinstance(case, Case) and id(case) not in seen:
          seen.add(id(case))
          cases.append(case)
    tables[path.name] = cases
  return tables


@pytest.fixture(scope="module")
def tables():
  """Per test module: (case name, the primitives it runs through rules)."""
  return {module: [(case.name, coverage.exercised(case)) for case in cases]
          for module, cases in case_tables().items()}


def test_the_coverage_doc_is_up_to_date(tables):
  expected = coverage.render(coverage.rows(), tables)
  out = os.environ.get(coverage.OUT_VARIABLE)
  if out:  # python tools/coverage.py asks for the document
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(expected)
    return
  doc = coverage.DOC
  actual = doc.read_text() if doc.exists() else ""
  if f"for JAX {jax.__version__};" not in actual:  # its table is one JAX version's
    pytest.skip(f"docs/coverage.md is generated for another JAX than {jax.__version__}")
  diff = "".join(difflib.unified_diff(actual.splitlines(True), expected.splitlines(True),
                                      "docs/coverage.md", "generated", n=0))
  assert actual == expected, f"docs/coverage.md is out of step; run {REGENERATE}\n{diff[:3000]}"


def test_every_rule_has_a_row_in_a_test_table(tables):
  exercised = set().union(*(prims for cases in tables.values() for _, prims in cases))
  missing = sorted(registered_names() - exercised)
  assert not missing, (f"rules that no row of tests/test_rules*.py exercises: {missing}; "
                       "add rows (harness.Case) whose functions reach them")


def _rule_module(prim) -> str:
  """The module of a primitive's rule: polyjit._masking.rules.<family>, or the
  module that holds it (data_dependent)."""
  layer = rule_layers(prim)[0]
  parts = layer.split(".")
  return ".".join(parts[:4]) if layer.startswith("polyjit._masking.rules.") else layer.rsplit(".", 1)[0]


def test_the_eager_vmap_samples_reach_every_rule_module_that_rows_reach(tables):
  """harness.table_test runs the vmap check of most rows under jax.jit and
  eager `jax.vmap` for a sample: the samples of all tables together reach
  every rule module that a row reaches whose vmap check is not `compiled`
  (random, linalg and the callbacks have only compiled rows)."""
  module_of = {p.name: _rule_module(p) for p in masking_rules}
  eager_cases, samples = {}, {}
  for module, cases in case_tables().items():
    eager_cases[module] = {c.name for c in cases if not c.compiled and "vmap" in c.modes}
    samples[module] = {c.name for c in cases if c.eager_vmap}
  reachable, sampled = set(), set()
  for module, rows in tables.items():
    sample = samples[module]
    assert sample <= eager_cases[module], (module, sorted(sample - eager_cases[module]))
    for name, prims in rows:
      modules = {module_of[p] for p in prims if p in module_of}
      if name in eager_cases[module]:
        reachable |= modules
      if name in sample:
        sampled |= modules
  assert len(reachable) >= 10, sorted(reachable)   # the test sees the tables
  missing = sorted(reachable - sampled)
  assert not missing, (f"rule modules that no eager_vmap row reaches: {missing}; name a row "
                       "that reaches them in its table's table_test(..., eager_vmap=...)")


def test_the_table_covers_every_public_primitive_once():
  names = [r.name for r in coverage.rows()]
  assert len(names) == len(set(names))
  public = {p.name for p in vars(jex_core.primitives).values()
            if isinstance(p, jex_core.Primitive)}
  assert public | registered_names() == set(names)
  assert {r.status for r in coverage.rows()} <= {SUPPORTED, UNSUPPORTED, NOT_APPLICABLE}


def test_reasons_are_only_for_primitives_without_rules():
  names = {r.name for r in coverage.rows()}
  assert not set(REASONS) - names, "reasons for primitives the table does not list"
  with_rules = sorted(set(REASONS) & registered_names())
  assert not with_rules, f"these have rules now; delete their REASONS entries: {with_rules}"


def test_the_reason_reaches_the_user():
  f = lambda x: lax.rng_bit_generator(np.zeros(4, np.uint32), x.shape)[1]
  with pytest.raises(pj.MaskingError, match="Why it has none: XLA's RngBitGenerator"):
    pj.mask(f, ["n"])([np.zeros(8, np.float32)], {"n": 3})


def test_the_rule_table_refuses_a_name_that_matches_no_primitive():
  rule = lambda ctx, x: [x]
  with pytest.raises(ValueError, match=r"'cumsun'.*no JAX .* primitive has that name "
                     r"\(did you mean 'cumsum'.*optional=True"):
    register("cumsun")(rule)
  with pytest.raises(ValueError, match="'no_such_primitive'"):
    register("rng_uniform", "no_such_primitive")(rule)
  assert "rng_uniform" not in registered_names()  # nothing registered before raising
  assert register("no_such_primitive", optional=True)(rule) is rule
  assert rule not in masking_rules.values()


def test_the_rule_table_has_one_way_in():
  """`register` is the only path into the table: a direct write raises, so its
  checks (no typo, no second rule) hold for every entry."""
  prim = next(iter(masking_rules))
  with pytest.raises(TypeError):
    masking_rules[prim] = lambda ctx, x: [x]  # type: ignore[index]
  assert masking_rules[prim] is not None


def test_a_wrapper_goes_through_register_and_is_listed():
  argmax, = (p for p in masking_rules if p.name == "argmax")
  layers = rule_layers(argmax)
  assert layers[0].startswith("polyjit._masking.rules.")  # the family's rule first
  assert layers[1:] == ["polyjit._masking.data_dependent.checked_nonempty_reduction"]
  wrapper = lambda rule: rule
  with pytest.raises(RuntimeError, match="has none yet"):
    register("rng_uniform", wraps=True)(wrapper)  # no rule to wrap
  with pytest.raises(RuntimeError, match="twice"):
    register("argmax", wraps=True)(checked_nonempty_reduction)
  assert rule_layers(argmax) == layers


def test_no_module_writes_the_rule_table_directly():
  """Source check beside the read-only table: no `masking_rules[...] =` or
  `_rules[...] =` outside `register` itself."""
  import ast
  root = Path(pj.__file__).parent
  offenders = []
  for path in root.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
      for t in targets:
        if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
            and t.value.id in ("masking_rules", "_rules")):
          offenders.append(f"{path.relative_to(root)}:{node.lineno}")
  # Two writes, both inside `register`: a rule, and a rule wrapped.
  assert [o.split(":")[0] for o in offenders] == ["_masking/core.py"] * 2, offenders
