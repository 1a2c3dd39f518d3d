"""Builders of tiny random-init models of every supported architecture, for tests and benchmarks."""
