"""Example trainables shipped with the package (importable on every Ray worker that has it
installed)."""
