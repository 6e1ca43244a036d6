"""Ragged batching: `pj.Ragged`, `pj.vmap` and length groups.

Modules (each imports only those above it):
  host       examples on the host: validated once, padded with NumPy
  ragged     `Ragged`, the pytree of padded data, lengths and example count
  arguments  the flat arguments of a `pj.vmap` call: axes, paths, batch size
  sharing    which Ragged arguments share their size variables
  plan       one argument structure's masked function, padded sizes, and the
             check that shared lengths agree
  vmap       `RaggedVmapped` and `pj.vmap` over Ragged arguments
  groups     `LengthGroups`, `GroupedRagged`: a batch in blocks by length,
             and the `pj.vmap` that also runs them
  packing    `pj.Packing`, the first-fit-decreasing planner, `PackedRagged`
             (imported by ragged: it builds on host alone)
  packed_layout, packed_values, packed_eval, packed_pairs, packed_pair_shapes,
  packed_scan, packed_custom
             the per-example jaxpr evaluated on packed rows (packed_values:
             its values and its refusal, `Unpackable`)
  packed_vmap `pj.vmap` over a `PackedRagged` (packed, or unpacked with a
             PerformanceWarning)
"""
