"""The layout's one direction of dependency (docs/DESIGN.md section 4), checked.

Each private subpackage imports only the packages listed before it in `ORDER`,
counting imports inside functions and under `TYPE_CHECKING`: a change that
makes `_masking` reach up into `_jit` fails here, not in a reviewer's head.
"""
from __future__ import annotations

import ast
from pathlib import Path

import polyjit as pj

ROOT = Path(pj.__file__).parent
#: Lowest first. A package may import those before it, never those after.
ORDER = ["_jax", "_masking", "_spellings", "_caching", "_buckets", "_sharding", "_jit",
         "_ragged", "diagnostics", "_cli"]


def _imported_packages(path: Path, root: Path = ROOT) -> set[str]:
  """The top-level polyjit packages a module imports (relative or absolute)."""
  here = list(path.relative_to(root.parent).with_suffix("").parts)[:-1]  # its package
  found: set[str] = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom):
      if node.level:
        base = here[:len(here) - node.level + 1] + (node.module.split(".") if node.module else [])
      elif node.module and node.module.split(".")[0] == "polyjit":
        base = node.module.split(".")
      else:
        continue
      targets = [base + [a.name] for a in node.names] if len(base) == 1 else [base]
      found.update(t[1] for t in targets)
    elif isinstance(node, ast.Import):
      found.update(a.name.split(".")[1] for a in node.names
                   if a.name.startswith("polyjit.") and a.name.count(".") >= 1)
  return found


def test_each_package_imports_only_the_ones_below_it():
  assert sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()) \
      == sorted(ORDER), "a new subpackage needs its place in ORDER (and in docs/DESIGN.md)"
  wrong = []
  for package in ORDER:
    allowed = set(ORDER[:ORDER.index(package) + 1])
    for path in sorted((ROOT / package).rglob("*.py")):
      for other in _imported_packages(path) - allowed:
        if other in ORDER:
          wrong.append(f"{path.relative_to(ROOT)} imports {other}")
  assert not wrong, wrong


def test_few_modules_on_the_first_floor_and_an_init_that_only_re_exports():
  first_floor = [p.name for p in ROOT.glob("*.py")]
  assert len(first_floor) <= 14, first_floor
  tree = ast.parse((ROOT / "__init__.py").read_text())
  defined = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
  assert not defined, "polyjit/__init__.py re-exports; definitions live in subpackages"


def test_the_checker_sees_an_upward_import(tmp_path):
  """The check above can fail: a `_masking` module importing `_jit` in a function."""
  bad = tmp_path / "polyjit" / "_masking" / "probe.py"
  bad.parent.mkdir(parents=True)
  bad.write_text("def f():\n  from .._jit import function\n  return function\n")
  assert _imported_packages(bad, tmp_path / "polyjit") == {"_jit"}
