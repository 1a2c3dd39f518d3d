"""Files, limits and pictures: lad's one rule for what it reads and writes (docs/errors.md)."""
