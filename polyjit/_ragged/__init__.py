"""Ragged batching: `pj.Ragged`, `pj.vmap` and length groups."""
