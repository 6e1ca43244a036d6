"""`pj.jit` and `pj.filter_jit`: bucket, pad, mask, compile once per bucket.

`function` is the call path (`JitFunction`, which only dispatches), `options` the
one definition of `pj.jit`'s keywords, `planner` from a call's arguments to its plan
(structures; when to mask, fall back, warn), `bucket_choice` the bucket policies and
the cost-aware rental bookkeeping, `compile` programs through the executable cache,
`args` how a call's arguments are seen, `plans` the bookkeeping from shapes to
programs, `stats` what was compiled and why, `aot` the ahead-of-time stages (through
the planner's public methods), `auto` the automatic mode, `annotations` jaxtyping
specs, `data_dependent` outputs with data-dependent sizes, `filter_jit` Equinox's
semantics.
"""
