"""The one way the `textenv` commands, the demo and the examples read their options, and how a bad setting is said.

Options are dataclasses read by TRL's `TrlParser` (an `HfArgumentParser`), as TRL's own scripts read theirs:
``--config run.yaml`` reads any option from a file and the command line overrides it; every option takes both
spellings (``--max_turns`` and ``--max-turns``); ``--model``, ``--lora`` and ``--lora_rank`` are understood by
every command whichever class holds the model and LoRA options (`ALIAS_GROUPS`). `OptionParser` adds:

- `given`: the options given on the command line or in the ``--config`` file, so that a command can derive a
  default from the options given (``derive``) before its dataclasses are built and checked;
- an unknown option, a bad value or a missing value as a one-line `ValueError` naming the option (and, for a
  misspelt one, the closest known), where argparse would print its usage and exit; abbreviations are refused
  (``--learning`` is not ``--learning_rate``: an abbreviation that is unique today may not be tomorrow).

Settings errors: each command runs its settings phase (parsing, the checks, loading the model, the rows and the
environment its options name) inside `settings_phase()`. A `ValueError`, `OSError`, `ImportError` or `LookupError`
raised there is marked as a settings error; the `textenv` console prints it as one line, ``textenv COMMAND:
error: MESSAGE``, and exits with status 2 (``--debug`` shows the traceback). Python callers get the exception
itself, unchanged.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

# Spellings of one option across commands: each is rewritten to the one the command's parser knows.
ALIAS_GROUPS = (
    ("--model", "--model_name_or_path"),
    ("--lora", "--use_peft"),
    ("--lora_rank", "--lora-rank", "--lora_r"),
    ("--lr", "--learning_rate"),
)
SETTINGS_ERRORS = (ValueError, OSError, ImportError, LookupError)
_MARK = "textenv_settings_error"

Derive = Callable[[argparse.Namespace, frozenset], None]


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, each option's default after its help."""


def with_aliases(argv: Sequence[str], known: set[str]) -> list[str]:
    """`argv` with each spelling of `ALIAS_GROUPS` the parser does not know replaced by the one it knows
    (``--model=x`` too)."""
    replaced = []
    for argument in argv:
        name, sep, value = argument.partition("=")
        group = next((group for group in ALIAS_GROUPS if name in group), ())
        if name in known or not group:
            replaced.append(argument)
            continue
        target = next((spelling for spelling in group if spelling in known), name)
        replaced.append(target + sep + value)
    return replaced


def _trl_parser() -> type:
    from trl import TrlParser

    return TrlParser


class OptionParser:
    """A command's parser: TRL's `TrlParser` over `classes`, which also records the options given and reports
    every error as a one-line `ValueError` (see the module's doc).

    Args:
        classes (`Sequence[type]`): the option dataclasses, e.g. ``(PPOConfig, EpisodeArguments, ModelConfig)``.
        prog (`str`, *optional*): the command's name in messages.
        description (`str`, *optional*): shown by ``--help``.
        defaults (`dict`, *optional*): the command's own defaults, by field name (the file and the command line
            override them).
        derive (*optional*): ``derive(values, given)`` may change the parsed values (an `argparse.Namespace`)
            before the dataclasses are built, knowing which option names were `given`.
    """

    def __init__(self, classes: Sequence[type], prog: Optional[str] = None, description: Optional[str] = None,
                 defaults: Optional[dict[str, Any]] = None, derive: Optional[Derive] = None):
        self.parser = _recording_parser(_trl_parser())(classes, prog=prog, description=description,
                                                        formatter_class=HelpFormatter, allow_abbrev=False)
        self.parser.derive = derive
        self.parser.given = set()
        if defaults:
            self.parser.set_defaults(**defaults)

    @property
    def given(self) -> frozenset:
        """The option names (dataclass field names) given in the last `parse`: command line and ``--config`` file."""
        return frozenset(self.parser.given)

    def parse(self, argv: Optional[Sequence[str]] = None) -> tuple:
        """One instance per class, in the order of `classes`.

        Raises:
            ValueError: an unknown option, a bad or missing value, or a value a class refuses (one line).
        """
        self.parser.given = set()
        argv = list(sys.argv[1:] if argv is None else argv)
        config = argv.index("--config") + 1 if "--config" in argv else None
        if config is not None and config >= len(argv):
            raise ValueError(f"--config needs a YAML file, e.g. --config run.yaml.")
        try:
            return tuple(self.parser.parse_args_and_config(with_aliases(argv, set(self.parser._option_string_actions))))
        except FileNotFoundError as error:
            if config is not None and argv[config] in str(error):
                raise FileNotFoundError(f"--config {argv[config]}: no such file.") from error
            raise


def one_line_errors(base: type) -> type:
    """`base` (an `argparse.ArgumentParser` class) whose errors raise a one-line `ValueError` naming the command
    instead of printing the usage and exiting."""
    class OneLineErrors(base):
        def error(self, message: str):
            raise ValueError(f"{message} (see {self.prog} --help).")

    return OneLineErrors


def _recording_parser(base: type) -> type:
    class RecordingParser(one_line_errors(base)):
        """`TrlParser` that records the options given and raises one-line errors (see `OptionParser`)."""

        given: set
        derive: Optional[Derive] = None

        def set_defaults_with_config(self, **config):  # the --config file's values count as given
            self.given.update(config)
            return super().set_defaults_with_config(**config)

        def parse_known_args(self, args=None, namespace=None):
            args = list(sys.argv[1:] if args is None else args)
            self.given.update(self._given_in(args))
            namespace, remaining = super().parse_known_args(args, namespace)
            if remaining:
                raise ValueError(self._unknown(remaining))
            if self.derive is not None:
                self.derive(namespace, frozenset(self.given))
            return namespace, remaining

        def _given_in(self, args: Sequence[str]) -> set:
            actions = (self._option_string_actions.get(argument.split("=", 1)[0]) for argument in args if argument.startswith("-"))
            return {action.dest for action in actions if action is not None}

        def _unknown(self, remaining: Sequence[str]) -> str:
            options = [argument.split("=", 1)[0] for argument in remaining if argument.startswith("-")]
            if not options:
                return f"unexpected argument {remaining[0]!r} (every option is --name value; see {self.prog} --help)."
            known = [name for name in self._option_string_actions if name.startswith("--")]
            hints = []
            for option in options:
                close = difflib.get_close_matches(option, known, n=1, cutoff=0.75)
                hints.append(f"{option} (did you mean {close[0]}?)" if close else option)
            return f"unknown option {', '.join(hints)}; see {self.prog} --help."

    return RecordingParser


def parse_options(
    classes: Sequence[type],
    argv: Optional[Sequence[str]] = None,
    prog: Optional[str] = None,
    description: Optional[str] = None,
    defaults: Optional[dict[str, Any]] = None,
) -> tuple:
    """Parse the command line (and its ``--config`` YAML file) into one instance of each dataclass.

    Args:
        classes (`Sequence[type]`): the option dataclasses, e.g. ``(PPOConfig, EpisodeArguments, ModelConfig)``.
        argv (`Sequence[str]`, *optional*): the arguments (default: ``sys.argv[1:]``).
        prog (`str`, *optional*): the command's name in messages.
        description (`str`, *optional*): shown by ``--help``.
        defaults (`dict`, *optional*): the command's own defaults, by field name (the file and the command
            line override them).

    Returns:
        One instance per class, in the order of `classes`.

    Raises:
        ValueError: an unknown option, a bad value, or a value refused by its class (the message names the option).
    """
    return OptionParser(classes, prog, description, defaults).parse(argv)


@contextmanager
def settings_phase() -> Iterator[None]:
    """Mark the `SETTINGS_ERRORS` raised inside as settings errors (see the module's doc); they propagate
    unchanged."""
    try:
        yield
    except SETTINGS_ERRORS as error:
        setattr(error, _MARK, True)
        raise


def is_settings_error(error: BaseException) -> bool:
    """Whether `error` was raised in a command's settings phase."""
    return bool(getattr(error, _MARK, False))


def one_line(error: BaseException) -> str:
    """The error's message on one line (a library's message may span several)."""
    return " ".join(str(error).split()) or type(error).__name__
