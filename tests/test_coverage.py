"""docs/coverage.md is in step with the code, and every rule has a test row.

The coverage table (polyjit/_coverage.py) is generated from the masking rules
and the test tables of tests/test_rules*.py. Whoever adds a rule, a reason or
a test row regenerates it:

    .venv/bin/python -m polyjit._coverage --write
"""

from __future__ import annotations

import difflib

import jax.extend.core as jex_core
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from polyjit import _coverage as coverage
from polyjit._core import registered_names

TESTS_DIR, DOC = coverage.repo_paths()
REGENERATE = ".venv/bin/python -m polyjit._coverage --write"


@pytest.fixture(scope="module")
def tables():
  """Per test module: (case name, the primitives it runs through rules)."""
  return {module: [(case.name, coverage.exercised(case)) for case in cases]
          for module, cases in coverage.case_tables(TESTS_DIR).items()}


def test_the_coverage_doc_is_up_to_date(tables):
  expected = coverage.render(coverage.rows(), tables)
  actual = DOC.read_text() if DOC.exists() else ""
  diff = "".join(difflib.unified_diff(actual.splitlines(True), expected.splitlines(True),
                                      "docs/coverage.md", "generated", n=0))
  assert actual == expected, f"docs/coverage.md is out of step; run {REGENERATE}\n{diff[:3000]}"


def test_every_rule_has_a_row_in_a_test_table(tables):
  exercised = set().union(*(prims for cases in tables.values() for _, prims in cases))
  missing = sorted(registered_names() - exercised)
  assert not missing, (f"rules that no row of tests/test_rules*.py exercises: {missing}; "
                       "add rows (harness.Case) whose functions reach them")


def test_the_table_covers_every_public_primitive_once():
  names = [r.name for r in coverage.rows()]
  assert len(names) == len(set(names))
  public = {p.name for p in vars(jex_core.primitives).values()
            if isinstance(p, jex_core.Primitive)}
  assert public | registered_names() == set(names)
  assert {r.status for r in coverage.rows()} <= {
      coverage.SUPPORTED, coverage.UNSUPPORTED, coverage.NOT_APPLICABLE}


def test_reasons_are_only_for_primitives_without_rules():
  names = {r.name for r in coverage.rows()}
  assert not set(coverage.REASONS) - names, "reasons for primitives the table does not list"
  with_rules = sorted(set(coverage.REASONS) & registered_names())
  assert not with_rules, f"these have rules now; delete their REASONS entries: {with_rules}"


def test_the_reason_reaches_the_user():
  f = lambda x: lax.rng_bit_generator(np.zeros(4, np.uint32), x.shape)[1]
  with pytest.raises(pj.MaskingError, match="Why it has none: XLA's RngBitGenerator"):
    pj.mask(f, ["n"])([np.zeros(8, np.float32)], {"n": 3})
