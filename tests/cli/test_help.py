"""Every option of every ``seer`` command says what it does (``--help`` is the CLI's documentation)."""

import argparse

from seer.cli.main import build_parser


def _options(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif action.dest != "help":
            yield f"{path} {'/'.join(action.option_strings) or action.dest}", action


def test_every_option_has_help_text():
    options = list(_options(build_parser(), "seer"))
    assert len(options) > 100  # every verb registered
    assert [name for name, action in options if not action.help] == []
