"""Bucket policies for `pj.jit` and `pj.Ragged` (see `polyjit._buckets`)."""

from ._buckets import (BucketPolicy, Exact, Explicit, Geometric, Multiples, PowersOfTwo,
                       as_policy, default)
from ._fit import fit
from ._policy import CostAware

__all__ = ["BucketPolicy", "CostAware", "Exact", "Explicit", "Geometric", "Multiples", "PowersOfTwo",
           "as_policy", "default", "fit"]
