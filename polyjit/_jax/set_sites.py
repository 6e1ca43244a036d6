"""Where user code hashes a size to build a set: may that set skip the sizes' values?

A set of sizes built only to compare them among themselves (Flax's
`lengths = set(jax.tree_util.tree_leaves(lengths))`, then `len(lengths)` and
`(length,) = lengths`) needs no size's value: every size may share one hash
(`decisions.SIZE_HASH`) and equal sizes meet in `==`, which the oracle
answers. That shortcut is exact only if no other value ever meets those sizes
through a hash, which Python would never report to polyjit:

- an int in the same set (`{n, 5}`) hashes to 5, never meets `n` in `==`, and
  the set keeps two members even when n == 5;
- an int looked up later (`5 in lengths`) misses a bucket that holds `n`.

So the shortcut is taken only where both are ruled out from the source: the
set is built by a display (`{a, b}`, `{*xs}`) or `set(...)`/`frozenset(...)`
whose members, re-read by a side-effect-free evaluation of the expression
(names, `.shape`, constant indices, `jax.tree_util.tree_leaves`, `list`,
`tuple`), are all symbolic sizes; and the set itself is only read in ways
its iteration order cannot change (`len(s)`, `(a,) = s`, `sorted(s)`,
`min(s)`, `if s:`, and `f"{s}"` for a message; not `for a in s`, `list(s)`,
`s.pop()` or `a, b = s`, which see the order the shared hash gives), directly or through one local name (not a global)
that no inner function captures and no `eval`/`locals()` reaches, wherever a
use may run after the assignment: later in its block, or in any block of an
enclosing statement (`except`, `else`, `finally`, a loop's next iteration).
`s |= {5}` counts as a use that is no read. Anything else hashes by value
(exact at concrete sizes, refused when sizes are traced).
"""
from __future__ import annotations

import ast
import builtins
import dis
import functools
import linecache
import types
from typing import Any, TypeGuard

import jax

from .dims import is_symbolic_dim
from .swaps import original_of

_SET_BUILDING_OPS = frozenset(
    dis.opmap[name] for name in ("BUILD_SET", "SET_ADD", "SET_UPDATE") if name in dis.opmap)
# (Python 3.11's specialized PRECALL runs a builtin's call itself.)
_CALL_OPS = frozenset(dis.opmap[name] for name in ("PRECALL", "CALL", "CALL_KW", "CALL_FUNCTION_EX")
                      if name in dis.opmap)
_SET_BUILDERS = (builtins.set, builtins.frozenset)
# Functions the member check may call again: pure, and they return fresh lists.
_PURE_CALLS = (jax.tree_util.tree_leaves, jax.tree.leaves, builtins.list, builtins.tuple)
# Builtins that read a set without asking whether a value is in it, and whose
# answer does not depend on the order the set iterates in: that order follows
# the hashes, so sharing one hash changes it (`list`, `tuple`, `for`, `pop` and
# `a, b = s` would see {3, 5} as 5, 3).
_READING_BUILTINS = {"len": builtins.len, "sorted": builtins.sorted, "min": builtins.min,
                     "max": builtins.max, "bool": builtins.bool}
# Names through which code reaches a local by its name, out of the syntax tree's sight.
_READS_LOCALS_BY_NAME = frozenset({"eval", "exec", "locals", "vars", "_getframe", "currentframe",
                                   "f_locals"})


class _Unknown(Exception):
  """An expression the member check does not evaluate again."""


def may_share_one_hash(frame: types.FrameType) -> bool:
  """Whether the instruction running in `frame` builds a set of sizes alone
  that is never asked whether a value is in it (module docstring)."""
  code = frame.f_code
  op = code.co_code[frame.f_lasti]
  if op not in _SET_BUILDING_OPS and op not in _CALL_OPS:
    return False
  found = _node_at(code, frame.f_lasti)
  if found is None:
    return False
  node, parents = found
  if not _only_read(node, parents, code, frame):
    return False
  try:
    members = _members(node, frame)
  except _Unknown:
    return False
  except Exception:   # the expression raised when read again: not provable
    return False
  return bool(members) and all(is_symbolic_dim(m) for m in members)


# --- the instruction's expression in the file's syntax tree -----------------------

@functools.lru_cache(maxsize=64)
def _parsed(filename: str, text_hash: int) -> tuple[dict[tuple[int, int, int, int], ast.AST],
                                                    dict[ast.AST, ast.AST]] | None:
  del text_hash   # (part of the key: a file edited since is parsed again)
  try:
    tree = ast.parse("".join(linecache.getlines(filename)))
  except (SyntaxError, ValueError):
    return None
  spans: dict[tuple[int, int, int, int], ast.AST] = {}
  parents: dict[ast.AST, ast.AST] = {}
  for parent in ast.walk(tree):
    for child in ast.iter_child_nodes(parent):
      parents[child] = parent
    if isinstance(parent, (ast.Set, ast.Call)) and parent.end_lineno is not None:
      spans[(parent.lineno, parent.end_lineno, parent.col_offset,
             parent.end_col_offset or 0)] = parent
  return spans, parents


def _node_at(code: types.CodeType, lasti: int) -> tuple[ast.AST, dict[ast.AST, ast.AST]] | None:
  positions = list(code.co_positions())
  if not 0 <= lasti // 2 < len(positions):
    return None
  line, end_line, col, end_col = positions[lasti // 2]
  if line is None or end_line is None or col is None or end_col is None:
    return None
  lines = linecache.getlines(code.co_filename)
  if not lines:
    return None
  parsed = _parsed(code.co_filename, hash(tuple(lines)))
  if parsed is None:
    return None
  spans, parents = parsed
  node = spans.get((line, end_line, col, end_col))
  return None if node is None else (node, parents)


# --- the members, read again without side effects ---------------------------------

def _members(node: ast.AST, frame: types.FrameType) -> list[Any]:
  if isinstance(node, ast.Set):
    return _elements(node.elts, frame)
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
    if _lookup(node.func.id, frame) not in _SET_BUILDERS or node.keywords or len(node.args) != 1:
      raise _Unknown
    return _iterable(_evaluate(node.args[0], frame))
  raise _Unknown


def _elements(elts: list[ast.expr], frame: types.FrameType) -> list[Any]:
  out: list[Any] = []
  for elt in elts:
    if isinstance(elt, ast.Starred):
      out.extend(_iterable(_evaluate(elt.value, frame)))
    else:
      out.append(_evaluate(elt, frame))
  return out


def _iterable(value: Any) -> list[Any]:
  if not isinstance(value, (list, tuple)):   # (an iterator would be consumed)
    raise _Unknown
  return list(value)


def _lookup(name: str, frame: types.FrameType) -> Any:
  for scope in (frame.f_locals, frame.f_globals, frame.f_builtins):
    if name in scope:
      return scope[name]
  raise _Unknown


def _evaluate(node: ast.expr, frame: types.FrameType) -> Any:
  if isinstance(node, ast.Constant):
    return node.value
  if isinstance(node, ast.Name):
    return _lookup(node.id, frame)
  if isinstance(node, ast.Attribute):
    base = _evaluate(node.value, frame)
    if not (isinstance(base, types.ModuleType) or node.attr == "shape"):
      raise _Unknown   # (a property could do anything)
    return getattr(base, node.attr)
  if isinstance(node, ast.Subscript):
    base = _evaluate(node.value, frame)
    index = _evaluate(node.slice, frame) if not isinstance(node.slice, ast.Slice) else slice(
        *(None if part is None else _evaluate(part, frame)
          for part in (node.slice.lower, node.slice.upper, node.slice.step)))
    if not isinstance(base, (tuple, list)) or not isinstance(index, (int, slice)):
      raise _Unknown
    return base[index]
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    value = _evaluate(node.operand, frame)
    if type(value) is not int:
      raise _Unknown
    return -value
  if isinstance(node, (ast.List, ast.Tuple)):
    return _elements(node.elts, frame)
  if isinstance(node, ast.Call) and not node.keywords:
    function = _evaluate(node.func, frame)
    if not any(function is pure for pure in _PURE_CALLS):
      raise _Unknown
    args = [_evaluate(a, frame) for a in node.args]
    if function in (builtins.list, builtins.tuple):
      args = [_iterable(a) for a in args]
    return function(*args)
  raise _Unknown


# --- the set's uses: counted, unpacked, iterated, printed, never looked up --------

def _only_read(node: ast.AST, parents: dict[ast.AST, ast.AST], code: types.CodeType,
               frame: types.FrameType) -> bool:
  parent = parents.get(node)
  if parent is None:
    return False
  if _is_a_read(node, parent, frame, code):
    return True
  if (isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1
      and isinstance(parent.targets[0], ast.Name)):
    name = parent.targets[0].id
    if name not in code.co_varnames or name in code.co_cellvars or name in code.co_freevars:
      return False   # a global, or captured: code elsewhere could look values up in it
    if _READS_LOCALS_BY_NAME & set(code.co_names):
      return False   # `eval("5 in s")`, `locals()["s"]`: uses the syntax tree does not show
    return all(_is_a_read(use, parents[use], frame, code) for use in _later_uses(parent, name, parents))
  return False


def _is_a_read(node: ast.AST, parent: ast.AST, frame: types.FrameType, code: types.CodeType) -> bool:
  if isinstance(parent, ast.Call) and node in parent.args:
    if (len(parent.args) == 1 and not parent.keywords and isinstance(parent.func, ast.Name)
        and parent.func.id in _READING_BUILTINS and parent.func.id not in code.co_varnames):
      try:
        # (`len` is swapped while polyjit traces, `_spellings/length.py`: the
        # builtin behind the swap's wrapper reads the set as the builtin does)
        return original_of(_lookup(parent.func.id, frame)) is _READING_BUILTINS[parent.func.id]
      except _Unknown:
        return False
    return False
  if isinstance(parent, ast.Assign) and parent.value is node:
    # `(a,) = s`: one member, or ValueError as unpadded (two targets see the order)
    return all(isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == 1
               and not isinstance(t.elts[0], ast.Starred) for t in parent.targets)
  # (an f-string shows the order, in a message only)
  if isinstance(parent, ast.FormattedValue) or (isinstance(parent, ast.If) and parent.test is node):
    return True
  return isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)


def _later_uses(assign: ast.Assign, name: str, parents: dict[ast.AST, ast.AST]) -> list[ast.Name]:
  """Uses of `name` that may see the set bound by `assign` (loads, and the
  target of `s |= {5}`, which is no read): the statements after it in its
  block, then every block of each enclosing statement up to the function
  (an `except`, `else` or `finally` block, a loop's body run again, may each
  run after it), and the statements after those. A rebinding ends nothing:
  an exception before it reaches a handler that still sees the set."""
  uses: list[ast.Name] = []
  statement: ast.AST = assign
  while True:
    owner = parents.get(statement)
    if owner is None:
      break
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
      block = getattr(owner, field, None)
      if not isinstance(block, list):
        continue
      # (the assignment's own block from the statement after it; any other block whole)
      later = block[block.index(statement) + 1:] if statement in block else block
      uses.extend(n for stmt in later for n in ast.walk(stmt) if _is_a_use(n, name, parents))
    if isinstance(owner, (ast.For, ast.While, ast.AsyncFor)):
      uses.extend(n for n in ast.walk(owner) if _is_a_use(n, name, parents)
                  and n is not assign.targets[0])
    if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
      break
    statement = owner
  return uses


def _is_a_use(node: ast.AST, name: str, parents: dict[ast.AST, ast.AST]) -> TypeGuard[ast.Name]:
  if not isinstance(node, ast.Name) or node.id != name:
    return False
  return isinstance(node.ctx, ast.Load) or isinstance(parents.get(node), ast.AugAssign)
