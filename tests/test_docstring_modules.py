"""Every module a docstring names exists: a reader following a package's map
(or a `_module.name` reference in any module) must find what it names.

Checked: in each package's `__init__` docstring, every backticked lowercase
name that is not an attribute of a module of the package must be one of its
modules (`core`, `rules/`), and every entry of an indented module list
(`  name   what it does`); in every module's docstring, every backticked
`_module.attribute` (polyjit's private modules) must resolve, from the
module's package or from `polyjit`.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import polyjit

ROOT = Path(polyjit.__file__).parent
ALIASES = {"jc"}  # `_jax` is imported as `jc` (its docstring says so)
_TICKED = re.compile(r"`([^`\s]+)`")
_LISTED = re.compile(r"^  ([a-z_][a-z0-9_]*)(?:/|\.py)?(?:,| {2,})", re.M)


def docstring(path: Path) -> str:
  return ast.get_docstring(ast.parse(path.read_text())) or ""


def packages() -> list[Path]:
  return sorted(p for p in ROOT.rglob("__init__.py") if "__pycache__" not in p.parts)


def modules_of(package: str) -> dict[str, object]:
  mod = importlib.import_module(package)
  out: dict[str, object] = {}
  for info in pkgutil.iter_modules(mod.__path__):
    out[info.name] = importlib.import_module(f"{package}.{info.name}")
  return out


def dotted(path: Path) -> str:
  rel = path.relative_to(ROOT.parent).with_suffix("")
  parts = list(rel.parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(base: str, reference: str) -> bool:
  """Whether `reference` (`mod.attr` or `mod`) names something from `base`."""
  head, *rest = reference.split(".")
  for package in (base, "polyjit"):
    try:
      obj = importlib.import_module(f"{package}.{head}")
    except ImportError:
      continue
    for name in rest:
      if not hasattr(obj, name):
        try:
          obj = importlib.import_module(f"{obj.__name__}.{name}")
        except (ImportError, AttributeError):
          return False
      else:
        obj = getattr(obj, name)
    return True
  return False


@pytest.mark.parametrize("init", packages(), ids=lambda p: str(p.parent.relative_to(ROOT.parent)))
def test_every_module_a_package_docstring_names_exists(init):
  package = dotted(init)
  modules = modules_of(package)
  text = docstring(init)
  missing = [name for name in _LISTED.findall(text) if name not in modules]
  for token in _TICKED.findall(text):
    name = token.rstrip("/")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or name in modules or name in ALIASES:
      continue
    if token.endswith("/") or not any(hasattr(m, name) for m in modules.values()):
      missing.append(token)
  assert not missing, f"{package}'s docstring names modules that do not exist: {missing}"


def all_modules() -> list[Path]:
  return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", all_modules(), ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_private_module_references_in_docstrings_resolve(path):
  base = dotted(path) if path.name == "__init__.py" else dotted(path).rpartition(".")[0]
  refs = [t for t in _TICKED.findall(docstring(path))
          if re.fullmatch(r"_[a-z_]+(\.[A-Za-z_][A-Za-z0-9_]*)+", t)]
  bad = [r for r in refs if not resolve(base, r)]
  assert not bad, f"{path.relative_to(ROOT.parent)} names what does not exist: {bad}"
