"""Flags shared by several commands, declared once."""

from __future__ import annotations

import argparse


def add_lad_flags(p: argparse.ArgumentParser) -> None:
    """LAD's inference options (§4.3); defaults are the paper's."""
    p.add_argument("--top-k", type=int, default=2, help="K layers selected by Eq. 9 (default 2)")
    p.add_argument("--tau", type=float, default=5.0, help="τ of Eq. 12 (default 5)")
