"""`textenv check-model`: will a model work for tool-use RL? Says so in seconds, before a long run.

Loads only the model's tokenizer and config (no weights) and prints what `textenv.chat.certify` finds: the family
and template it recognised, whether rendering is append-only turn by turn (as text and as ids), the tool-call format
and a sample call's round trip through the template and the parser, the token a reply stops at, how thinking is
handled, and the turn budget a call needs; then a one-line verdict, with the fix where something fails. Exit status
0 when the model works, 1 when it cannot, 2 for a bad option.

    textenv check-model bundled
    textenv check-model path/to/model --tools examples/counter_env.py:CounterEnv
    textenv check-model path/to/model --chat_template my_template.jinja --tool_parser hermes

`textenv train` and `textenv rollout` run the same check when their episodes use JSON tool calls and stop with the
verdict before any episode.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

from textenv.parsing import parse_options, settings_phase

MODEL_CANNOT_WORK = 1


@dataclass
class CheckModelArguments:
    """What `textenv check-model` checks."""

    model: Optional[str] = field(default=None, metadata={"help": "the model: 'bundled', a local folder or a hub id in the cache (also the first argument)"})
    tools: Optional[str] = field(
        default=None, metadata={"help": "the tools to describe: file.py:Name or module:Name, a TRL environment class (its public methods), "
                                        "a function, a list of functions or an object with tool_schemas (default: a calculator)"})
    chat_template: Optional[str] = field(default=None, metadata={"help": "a Jinja chat template file to use instead of the tokenizer's"})
    tool_parser: Optional[str] = field(default=None, metadata={"help": "the tool-call parser (default: the family's, or the template's format)"})


def parse(argv: Optional[Sequence[str]] = None) -> CheckModelArguments:
    """The options; a first argument that is not an option is the model.

    Raises:
        ValueError: no model given.
    """
    argv = list(argv or [])
    if argv and not argv[0].startswith("-"):
        argv = ["--model", *argv]
    (arguments,) = parse_options((CheckModelArguments,), argv, prog="textenv check-model", description=__doc__)
    if not arguments.model:
        raise ValueError("MODEL is missing: give a model, e.g. textenv check-model bundled or textenv check-model path/to/model.")
    return arguments


def main(argv: Optional[Sequence[str]] = None):
    """Run `textenv check-model`: print the certificate and return it; exits with status 1 when the model cannot work."""
    from textenv.chat.certificate import certify
    from textenv.chat.templates import read_chat_template

    with settings_phase():
        arguments = parse(argv)
        tokenizer, model_type, stop_ids = _load(arguments.model)
        schemas = tool_schemas_of(arguments.tools) if arguments.tools else None
        chat_template = read_chat_template(arguments.chat_template)
        certificate = certify(tokenizer, model=arguments.model, chat_template=chat_template, tool_parser=arguments.tool_parser,
                              schemas=schemas, stop_token_ids=stop_ids)
    print(f"model type: {model_type or 'unknown (no config)'}")
    print(certificate.report())
    if not certificate.works:
        raise SystemExit(MODEL_CANNOT_WORK)
    return certificate


def _load(model: str) -> tuple[Any, Optional[str], List[int]]:
    """The tokenizer, the config's model type and the generation config's end ids (no weights are loaded)."""
    from transformers import AutoConfig, GenerationConfig

    from textenv.models import load_tokenizer, resolve_model_path

    path = resolve_model_path(model)
    tokenizer = load_tokenizer(path)
    try:
        model_type = AutoConfig.from_pretrained(path).model_type
    except (OSError, ValueError):
        model_type = None
    try:
        ends = GenerationConfig.from_pretrained(path).eos_token_id
    except (OSError, ValueError):
        ends = None
    stop_ids = [ends] if isinstance(ends, int) else list(ends or [])
    return tokenizer, model_type, stop_ids


def tool_schemas_of(spec: str) -> List[dict]:
    """The JSON schemas of ``--tools``: a TRL environment class (an instance's public methods), a function, a list of
    functions, or an object (or class) with `tool_schemas`.

    Raises:
        ValueError: `spec` names nothing that has tools.
    """
    from textenv.gym.registry import load_object
    from textenv.environments.trl import tool_methods, tool_schemas

    target = load_object(spec, "--tools")
    if getattr(target, "tool_schemas", None):
        return list(target.tool_schemas)
    if inspect.isclass(target):
        return tool_schemas(tool_methods(target()), f"--tools {spec}")
    if callable(target):
        return tool_schemas([target], f"--tools {spec}")
    if isinstance(target, (list, tuple)) and target and all(callable(tool) for tool in target):
        return tool_schemas(list(target), f"--tools {spec}")
    raise ValueError(f"--tools {spec}: {type(target).__name__} has no tools (give a TRL environment class, a function, a list of functions "
                     "or an object with tool_schemas).")
