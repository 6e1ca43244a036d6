"""`python -m polyjit demo` and `python -m polyjit bench`."""
