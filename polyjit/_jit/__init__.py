"""`pj.jit` and `pj.filter_jit`: bucket, pad, mask, compile once per bucket.

`function` is the call path (`JitFunction`), `args` how a call's arguments are seen,
`plans` the bookkeeping from shapes to programs, `stats` what was compiled and why,
`aot` the ahead-of-time stages, `auto` the automatic mode, `annotations` jaxtyping
specs, `data_dependent` outputs with data-dependent sizes, `filter_jit` Equinox's
semantics.
"""
