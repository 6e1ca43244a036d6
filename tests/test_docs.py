"""The documentation site: every ```python block in docs/ runs, and
`mkdocs build --strict` passes.

Each page's blocks run in order in one fresh namespace (a page is one script
split by prose), in this process: importing JAX once keeps the whole site
within a few seconds. A failing block is named by page and line. DESIGN.md is
the design contract: its API block is a sketch of signatures, not a program,
so that page alone is not executed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_EXECUTED = {"DESIGN.md": "the design contract's API sketch (signatures, not a program)"}
_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
  return sorted(p for p in DOCS.rglob("*.md") if p.name not in NOT_EXECUTED)


def python_blocks(page: Path) -> list[tuple[int, str]]:
  """(line number, source) of each fenced python block of a page."""
  text = page.read_text()
  return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in _FENCE.finditer(text)]


def test_every_page_is_in_the_nav():
  nav = (ROOT / "mkdocs.yml").read_text()
  missing = [str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
             if str(p.relative_to(DOCS)) not in nav]
  assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_the_python_blocks_of_a_page_run(page):
  blocks = python_blocks(page)
  namespace = {"__name__": f"docs_{page.stem}"}
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # a page may show a FallbackWarning on purpose
    for line, source in blocks:
      where = f"{page.relative_to(ROOT)}:{line}"
      exec(compile(source, where, "exec"), namespace)


def test_the_site_builds_strictly(tmp_path):
  if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
    pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
  run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                        str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert run.returncode == 0, run.stdout + run.stderr
  assert (tmp_path / "site" / "api" / "index.html").exists()
