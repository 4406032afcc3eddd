"""Getting an SDK, in stages: where the bytes come from (pipeline), what they must match
(gate), safe extraction (archive, zipindex, partial), the atomic commit (commit), and pruning.
"""
