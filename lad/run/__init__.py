"""A run: what defines its records, the stages that make them, the run directory they live in,
the checks before any model work, `evaluate`, and the `Debiaser` facade."""
