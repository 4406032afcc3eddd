"""The host runtime: what the machine has (glibc, the loader's cache, the CPU), ELF files,
Debian/RPM packages, and the libc++ trio staged for an SDK.
"""
