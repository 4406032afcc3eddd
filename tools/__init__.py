"""Tools for developing qnnctl, run from the repository's root (`python -m tools.mutation`); not part of
the package that is shipped (pyproject.toml lists its packages)."""
