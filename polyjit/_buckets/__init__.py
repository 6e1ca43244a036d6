"""Bucket policies: which padded size serves each logical size.

`fixed` has the fixed policies (powers of two, geometric, multiples, explicit, exact),
`cost_aware` the default policy that buys a tighter bucket once it has paid for itself
(ski rental), `cost_model` its estimate of run and compile time, `fit` the best buckets
for a known sample of sizes.
"""
