"""Fault-injection tests: bad input against the real stack."""
