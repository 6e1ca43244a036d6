"""The masking transformation: a symbolic jaxpr evaluated on padded arrays.

`core` is the interpreter and the one rule table (`register`); `rules/` holds one
primitive family per file; `spec` and `dims` parse shapes and do the size algebra;
`mask` is `pj.mask` and the symbolic trace; `calls` binds a masked evaluation as one
differentiable equation; `variants`, `data_dependent`, `autodiff`, `size_range`,
`verify`, `refusals`, `errors` and `padding` are the pieces `mask` builds on.
Nothing here knows about buckets, `pj.jit` or ragged batches.
"""
