"""Sharded arguments: padding that keeps each array on its mesh."""
