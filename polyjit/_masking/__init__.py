"""The masking transformation: a symbolic jaxpr evaluated on padded arrays.

`core` is the interpreter (`MaskEnv`, `RuleContext`) and the one rule table
(`register`); `rules/` holds one primitive family per file; `spec` and `dims` parse
shapes and do the size algebra; `trace` is the symbolic trace of a user function
and its derivatives; `scopes` chooses the symbolic scope each trace runs in; `mask`
is `pj.mask` (`Masked`) on top of them; `calls` binds a masked evaluation as one
differentiable equation; `variants` (size comparisons in user code),
`data_dependent`, `autodiff`, `size_range`, `verify`, `refusals`, `errors`,
`padding` and `lapack_order` are the pieces `mask` builds on.
Nothing here knows about buckets, `pj.jit` or ragged batches.
"""
