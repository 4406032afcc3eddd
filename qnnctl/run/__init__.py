"""Running a pipeline with an SDK: the environment a process gets, `qnnctl lower`, the AMD
guard (bootstrap and the site hook), the library API, `which`, `inspect` and the load probe.
"""
