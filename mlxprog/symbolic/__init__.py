"""Symbolic dims: expressions (:mod:`.expr`), binding from input shapes and
buckets (:mod:`.binding`), specialisation with the sample sizes
(:mod:`.specialize`) and the per-binding cache (:mod:`.cache`). Validation of
symbolic programs is in :mod:`mlxprog.validate.symbolic`."""
