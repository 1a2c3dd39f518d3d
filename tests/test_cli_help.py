"""Every `lad` command has help text that ends in an example (STYLE.md)."""

import argparse

import pytest

from lad.cli import build_parser


def _commands(parser: argparse.ArgumentParser, prefix: str = "lad"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                leaves = list(_commands(sub, f"{prefix} {name}"))
                yield from leaves or [(f"{prefix} {name}", sub)]


COMMANDS = dict(_commands(build_parser()))


def test_every_command_group_is_registered():
    groups = {name.split()[1] for name in COMMANDS}
    assert groups >= {"eval", "calibrate", "predict", "report", "score", "metrics", "data", "demo"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_has_help_with_an_example(name):
    text = COMMANDS[name].format_help()
    assert COMMANDS[name].description, f"{name} has no description"
    assert "example" in text.lower(), f"{name}'s help shows no example"
