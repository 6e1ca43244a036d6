"""polyjit leaves plain JAX alone: with polyjit's on-disk cache on (its
default, outside this suite), a plain `jax.jit` function compiled before and
after `pj.jit` and `pj.vmap` calls neither reads nor writes polyjit's cache,
and every `jax.config` value is the same after polyjit ran as before. Run in
fresh processes with a temporary HOME (the default cache directory,
`~/.cache/polyjit`), twice, so the second process has a warm cache to (not)
read from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, jax, jax.numpy as jnp, numpy as np

def config():
  return {n: repr(getattr(jax.config, n, v)) for n, v in jax.config.values.items()}

before = config()
import polyjit as pj
from polyjit._caching import disk
from polyjit.diagnostics import count_compiles

def g(x):
  return jnp.sin(x) * 2.0

def h(x):
  return jnp.cos(x) + 1.0

plain_g, plain_h = jax.jit(g), jax.jit(h)
with count_compiles() as plain_before:
  plain_g(np.ones(3, np.float32))
after_import = config()

f = pj.jit(lambda x: jnp.sum(x * x))
with count_compiles() as polyjit_log:
  for n in (5, 9, 17, 40):
    f(np.ones(n, np.float32))
ragged = jax.jit(pj.vmap(lambda x: jnp.sum(x)))
ragged(pj.Ragged.from_list([np.ones(3, np.float32), np.ones(7, np.float32)]))

with count_compiles() as plain_after:
  plain_g(np.ones(4, np.float32))
  plain_h(np.ones(5, np.float32))
after = config()
print(json.dumps({
    "changed": sorted(n for n in before if after.get(n) != before[n]),
    "changed_by_import": sorted(n for n in before if after_import.get(n) != before[n]),
    "added": sorted(set(after) - set(before)),
    "plain": [[e.fun_name for e in log] for log in (plain_before, plain_after)],
    "plain_loads": len(plain_before.cache_loads) + len(plain_after.cache_loads),
    "polyjit": [len(polyjit_log), len(polyjit_log.cache_loads)],
    "root": disk.root(),
}))
"""


def run(home) -> dict:
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("POLYJIT_", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE",
                              "XDG_CACHE_HOME"))}
  env.update(HOME=str(home), PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def listing(root) -> dict[str, int]:
  out = {}
  for base, _, names in os.walk(root):
    for name in names:
      path = os.path.join(base, name)
      out[os.path.relpath(path, root)] = os.stat(path).st_mtime_ns
  return out


def test_plain_jax_jit_is_untouched_by_polyjit(tmp_path):
  first = run(tmp_path)
  root = first["root"]
  assert root == str(tmp_path / ".cache" / "polyjit")
  assert first["polyjit"][0] > 0  # polyjit compiled (and kept) its programs
  written = listing(root)
  # polyjit's directory holds polyjit's programs and bucket memories, nothing of g or h
  assert written and not [n for n in written if "jit_g" in n or "jit_h" in n], written
  assert len([n for n in written if n.startswith("xla")]) == first["polyjit"][0]

  second = run(tmp_path)
  # polyjit's warm start holds: nothing compiled, programs loaded (the exact
  # first-call program of the first run is not needed: the second starts with
  # the axes the first learned, `_caching/axes.py`)
  assert second["polyjit"][0] == 0 and 0 < second["polyjit"][1] <= first["polyjit"][0]
  for report in (first, second):
    # no jax.config value changed (polyjit's own trace-epoch option may be added)
    assert report["changed"] == [] and report["changed_by_import"] == []
    assert all(n.startswith("polyjit_") for n in report["added"]), report["added"]
    # g and h compiled, every time, and nothing was loaded for them from anywhere
    assert [len(names) for names in report["plain"]] == [1, 2], report["plain"]
    assert report["plain_loads"] == 0
  again = listing(root)
  assert set(again) == set(written)  # the second process wrote nothing new
