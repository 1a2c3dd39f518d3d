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


def _group_help(parser: argparse.ArgumentParser, group: str) -> str:
    """The one-line help `lad --help` gives a command group."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(c.help for c in action._choices_actions if c.dest == group)


def test_lad_help_names_every_data_command():
    parser = build_parser()
    line = _group_help(parser, "data")
    names = {name.split()[2] for name in COMMANDS if name.startswith("lad data ")}
    assert {"mmlu", "judgments", "text", "text-demo", "shapes", "blink"} <= names
    listed = {word.strip(" ,") for word in line.split(":", 1)[1].split(",")}
    assert listed == names


def test_eval_help_says_candidates_and_every_prompt_placeholder():
    from lad.core.prompts import PLACEHOLDERS, QUERY_PLACEHOLDERS

    text = " ".join(COMMANDS["lad eval"].format_help().split())
    assert "N images per query" not in text
    assert "N candidates per query (images or text options)" in text
    shown = [p for p in PLACEHOLDERS if p not in QUERY_PLACEHOLDERS[1:]]  # aliases of {query}
    assert "{options}" in text
    for placeholder in shown:
        assert "{" + placeholder + "}" in text, placeholder


@pytest.mark.parametrize("command", ["calibrate", "predict", "serve"])
def test_every_model_flag_reaches_the_debiaser(command, monkeypatch, tmp_path):
    """Each setting of the Debiaser a command declares a flag for is handed to it, none silently
    dropped (lad predict --batch-size was, before this test)."""
    import lad.run.debiaser
    from lad.cli import run as cli_run

    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages }}")
    stated = {
        "model": "some/model",
        "device": "cpu",
        "trust_remote_code": True,
        "engine": "hf",
        "dtype": "float32",
        "labels": "upper",
        "batch_size": 3,
        "chat_template": str(template),
    }
    # How records are scored: each as typed and as parsed (lad serve dropped all but two).
    options = {"top_k": ("3", 3), "tau": ("2.5", 2.5), "layer_range": ("1,2", (1, 2))}
    options |= {"mixture": ("log", "log"), "attn_mean": ("raw", "raw")}
    options |= {"obs_mean": ("logit", "logit"), "blank_alpha": ("0.5", 0.5)}
    parser = build_parser()
    declared = {a.dest for a in COMMANDS[f"lad {command}"]._actions}
    argv = [command]
    for name, value in stated.items():
        flag = "--" + name.replace("_", "-")
        if name in declared:
            argv += [flag] if value is True else [flag, str(value)]
    for name, (typed, _) in options.items():
        argv += ["--" + name.replace("_", "-"), typed] if name in declared else []
    stated |= {name: parsed for name, (_, parsed) in options.items()}
    argv += ["--calibration", "c.json"] if command != "calibrate" else ["--out", "c.json"]
    argv += ["--data", "d.jsonl"] if command == "calibrate" else []
    argv += ["--query", "q", "a.png"] if command == "predict" else []
    args = parser.parse_args(argv)
    given = {}
    monkeypatch.setattr(
        lad.run.debiaser, "Debiaser", lambda model, **kw: given.update(kw, model=model)
    )
    cli_run.build_debiaser(args)
    assert {n: given[n] for n in stated if n in declared} == {
        n: v for n, v in stated.items() if n in declared
    }
    assert command == "serve" or given["batch_size"] == 3  # serve's engine batches itself
