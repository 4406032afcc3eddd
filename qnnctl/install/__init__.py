"""Getting an SDK, in stages: where the bytes come from (pipeline, partial), what they must
match (qnnctl.sdk.gate), safe extraction (archive, zipindex), the atomic commit (commit); removal (prune).
"""
