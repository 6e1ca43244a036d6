"""Bucket policies for `pj.jit` and `pj.Ragged` (see `polyjit._buckets`)."""

from ._buckets.fixed import (BucketPolicy, Exact, Explicit, Geometric, Multiples, PowersOfTwo,
                             as_policy, default)
from ._buckets.fit import fit
from ._buckets.cost_aware import CostAware

__all__ = ["BucketPolicy", "CostAware", "Exact", "Explicit", "Geometric", "Multiples", "PowersOfTwo",
           "as_policy", "default", "fit"]
