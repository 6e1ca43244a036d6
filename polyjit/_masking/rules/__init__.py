"""Masking rules, one module per primitive family.

Importing this package imports every public module in it, and each module
registers its rules through `polyjit._masking.core.register`.
A new family is a new file here; each module's docstring says why its family
needs the rules it has.
"""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
  if not _info.name.startswith("_"):
    importlib.import_module(f"{__name__}.{_info.name}")
