"""Bucket policies for `pj.jit` and `pj.Ragged` (see `polyjit._buckets`)."""

from ._buckets import (BucketPolicy, Exact, Explicit, Geometric, Multiples, PowersOfTwo,
                       as_policy, default)

__all__ = ["BucketPolicy", "Exact", "Explicit", "Geometric", "Multiples", "PowersOfTwo",
           "as_policy", "default"]
