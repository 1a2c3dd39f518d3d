"""The house's rules, as tools/structure.py measures them (docs/architecture.md): no import loop,
at most 9 layers, no module over 500 lines, every run-directory file named in lad.run.rundir
alone, and no private name imported from another module of lad."""

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "structure.py"


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("lad_structure_tool", TOOL)
    structure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(structure)
    structure.capability_lines = lambda lines: {}  # git blame of every module: not a rule here
    return structure.measure()


def test_no_import_loop_and_at_most_nine_layers(figures):
    assert figures["import_loops"] == []
    assert figures["layers"] <= 9


def test_no_module_over_500_lines(figures):
    assert figures["modules_over_500_lines"] == {}


def test_every_run_directory_file_is_named_in_rundir_alone(figures):
    assert figures["run_names_outside_rundir"] == []


def test_no_private_name_is_imported_across_modules(figures):
    assert figures["private_imports"] == []
