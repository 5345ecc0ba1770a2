"""Every documented command line, found where a reader finds it, for tests/test_docs_commands.py.

Where: the README's and the documentation pages' ```bash blocks and inline code spans, the notebooks' markdown
cells, the examples' docstrings (indented lines and ``code`` spans) and the ``--help`` text of every `textenv`
command and example (its description and epilog, as printed). What: a `textenv COMMAND ...` invocation, also
behind a path (``.venv/bin/textenv``), environment assignments (``CUDA_VISIBLE_DEVICES=1 textenv ...``) or a
launcher (``accelerate launch ... $(which textenv) train ...``), and ``python examples/NAME.py ...``.

A synopsis in prose or help (``--task calculator|gym|verifiers``, ``[--quick]``) stands for every command it
spells: brackets are dropped and each ``a|b`` value is expanded. A placeholder value (``ID``, ``PATH``, ...) is
replaced by a real one (`PLACEHOLDERS`); ``...`` is refused: a documented command is written whole. An inline
span that is only ``textenv COMMAND`` names the command (it is not a command line).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.docs_blocks import PAGES, ROOT, page_blocks

SHELL_LANGUAGES = {"bash", "sh", "shell", "console", ""}
SEPARATORS = {"&", "&&", "|", "||", ";"}
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
INLINE_SPAN = re.compile(r"(``?)(?!`)([^`]{1,400}?)\1(?!`)")
PLACEHOLDERS = {"ID": "arithmetic", "NAME": "guess_number", "PATH": "outputs/demo", "N": "4", "K": "1", "M": "10", "PORT": "8000",
                "ROWS": "examples/data/guess_number.jsonl", "FILE": "examples/gym_plugin.py", "FILE:CLASS": "examples/counter_env.py:CounterEnv"}
EXAMPLES = ROOT / "examples"
CANDIDATE = re.compile(r"textenv\)?\s+(demo|train|rollout|serve|view)\b|\bpython3?\s+examples/")


@dataclass
class DocumentedCommand:
    """One command line as documented: where it is, its text, and what it runs."""

    where: str
    text: str
    program: str  # a textenv subcommand ("train", ...) or an example script ("examples/gym_env.py")
    argv: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    only_named: bool = False  # an inline `textenv COMMAND` naming the command, or a `--help` line

    @property
    def is_example(self) -> bool:
        return self.program.endswith(".py")

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def invocations(text: str, where: str, inline: bool = False) -> list[DocumentedCommand]:
    """The command lines in one piece of shell text (a line, or an inline code span), synopses expanded."""
    if not CANDIDATE.search(text):
        return []
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as error:  # unbalanced quotes
        raise AssertionError(f"{where}: cannot read {text!r} as a shell line ({error})") from error
    found = []
    for start, token in enumerate(tokens):
        program, first = _program(tokens, start)
        if program is None:
            continue
        environment = {}
        for assignment in reversed(tokens[:start]):
            if not ASSIGNMENT.match(assignment):
                break
            name, _, value = assignment.partition("=")
            environment[name] = value
        argv = list(itertools.takewhile(lambda token: token not in SEPARATORS, tokens[first:]))
        named_only = (inline and not argv) or any(argument in ("-h", "--help") for argument in argv)
        for expanded in _expanded(argv):
            found.append(DocumentedCommand(where, text.strip(), program, expanded, environment, named_only))
    return found


def _program(tokens: list[str], index: int) -> tuple[str | None, int]:
    """(the program, the index of its first argument) if `tokens[index]` starts an invocation."""
    from textenv.cli import SUBCOMMANDS

    token = tokens[index].rstrip(")")
    if (token == "textenv" or token.endswith("/textenv")) and index + 1 < len(tokens) and tokens[index + 1] in SUBCOMMANDS:
        return tokens[index + 1], index + 2
    if token in ("python", "python3") and index + 1 < len(tokens) and re.fullmatch(r"examples/\w+\.py", tokens[index + 1]):
        return tokens[index + 1], index + 2
    return None, index


def _expanded(argv: list[str]) -> list[list[str]]:
    """A synopsis's command lines: brackets dropped, every ``a|b`` value expanded, placeholders replaced."""
    choices = []
    for argument in argv:
        argument = argument.strip("[]")
        options = argument.split("|") if "|" in argument and not argument.startswith("{") else [argument]
        choices.append([PLACEHOLDERS.get(option, option) for option in options])
    return [list(line) for line in itertools.product(*choices)]


def shell_lines(source: str) -> list[tuple[int, str]]:
    """(index of its first line, text) of each line of shell text, backslash continuations joined."""
    lines, pending, start = [], [], 0
    for number, line in enumerate(source.split("\n")):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending.append(line.rstrip()[:-1])
            continue
        text = " ".join(part.strip() for part in [*pending, line])
        pending = []
        if text:
            lines.append((start, text))
    return lines


def _code_spans(prose: str) -> list[tuple[int, str]]:
    """(offset, text) of the inline code spans of `prose` (Markdown `x` and reST ``x``)."""
    return [(match.start(), " ".join(match.group(2).split())) for match in INLINE_SPAN.finditer(prose)]


def page_commands(page: Path) -> list[DocumentedCommand]:
    """The commands of a Markdown page: its shell blocks' lines and its prose's inline spans."""
    text = page.read_text()
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    found, prose, last = [], [], 0
    for block in page_blocks(page):
        start = text.index("```" + block.language + "\n" + block.source, last)
        prose.append((last, text[last:start]))
        last = start + len(block.language) + len(block.source) + 7
        if block.language in SHELL_LANGUAGES:
            for offset, line in shell_lines(block.source):
                found += invocations(line, f"{name}:{block.line + 1 + offset}")
    prose.append((last, text[last:]))
    for base, chunk in prose:
        for offset, span in _code_spans(chunk):
            found += invocations(span, f"{name}:{text.count(chr(10), 0, base + offset) + 1}", inline=True)
    return found


def docstring_commands(text: str, where: str) -> list[DocumentedCommand]:
    """The commands of a docstring or a help text: its indented lines (continuations joined) and ``code`` spans."""
    found = []
    for offset, line in shell_lines("\n".join(line for line in text.splitlines() if line.startswith(" ") and not line.startswith(" " * 9))):
        found += invocations(line, f"{where} (indented line {offset + 1})")
    for _, span in _code_spans(text):
        found += invocations(span, where, inline=True)
    return found


def notebook_commands(notebook: Path) -> list[DocumentedCommand]:
    cells = json.loads(notebook.read_text())["cells"]
    found = []
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            found += [command for _, span in _code_spans(source) for command in invocations(span, f"{notebook.relative_to(ROOT)} cell {index}", inline=True)]
    return found


def help_text(program: str) -> str:
    """What ``textenv PROGRAM --help`` (or ``python examples/X.py --help``) prints."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
        parse_function(program)(["--help"])
    return buffer.getvalue()


def parse_function(program: str):
    """The function that parses `program`'s command line: a subcommand's or an example's ``parse(argv)``."""
    if program.endswith(".py"):
        import importlib

        return importlib.import_module(program.removesuffix(".py").replace("/", ".")).parse
    from textenv.cli import command_module

    return command_module(program).parse


def top_level_help() -> str:
    from textenv.cli import build_parser

    return build_parser().format_help()


def all_commands() -> list[DocumentedCommand]:
    """Every documented command line (see the module's doc), in page order."""
    from textenv.cli import SUBCOMMANDS

    found = [command for page in PAGES for command in page_commands(page)]
    found += [command for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")) for command in notebook_commands(notebook)]
    for script in sorted(EXAMPLES.rglob("*.py")):
        docstring = _module_docstring(script)
        found += docstring_commands(docstring, str(script.relative_to(ROOT)))
    found += docstring_commands(top_level_help(), "textenv --help")
    programs = [*SUBCOMMANDS, *(str(path.relative_to(ROOT)) for path in sorted(EXAMPLES.glob("*.py")) if "def parse(" in path.read_text())]
    for program in programs:
        found += docstring_commands(help_text(program), f"{program} --help" if program.endswith(".py") else f"textenv {program} --help")
    return found


def _module_docstring(path: Path) -> str:
    import ast

    return ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
