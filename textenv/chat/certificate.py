"""Will a model work for tool-use RL? Its tokenizer and chat template checked in seconds, before a long run.

`certify` renders a sample tool conversation with the model's own template and reports, one `Check` each: the
template and the family it belongs to, whether rendering is append-only turn by turn (as text and as ids), the
tool-call format and a sample call's round trip (rendered by the template, read back by the parser), the token a
reply stops at, how thinking is handled, and the turn budget a call needs. A failed check carries its fix; the
`Certificate`'s verdict is one line. ``textenv check-model`` prints it, and `ChatTools` (every JSON tool-call run)
stops with the verdict before any episode when a model cannot work.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional

from textenv.chat.budget import call_budget
from textenv.chat.conformance import Conformance, check_conformance
from textenv.chat.families import Family, recognise_family
from textenv.chat.renderer import ChatRenderer, ChatTemplateError, Messages
from textenv.chat.templates import CHATML_TOOLS_TEMPLATE, NoToolTemplate, template_takes_tools, tool_chat_template
from textenv.tools.tool_call_parsers import TOOL_CALL_PARSERS, get_tool_call_parser, parser_for_template

OK, NOTE, FAIL = "ok", "note", "fail"

SAMPLE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "Calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
SAMPLE_ARGUMENT = "(17 + 25) * 3 − √9 ≈ «é»"  # non-ASCII on purpose: templates escape or keep it
_RESULT = "textenv-tool-result-7f3a"


@dataclass
class Check:
    """One finding of `certify`.

    Args:
        name (`str`): what was checked (``"template"``, ``"append-only"``, ``"tool call"``, ...).
        status (`str`): ``"ok"``, ``"note"`` (works, with a consequence worth knowing) or ``"fail"``.
        detail (`str`): what was found.
        fix (`str`, *optional*): what to do about a failure.
    """

    name: str
    status: str
    detail: str
    fix: Optional[str] = None

    def line(self) -> str:
        mark = {OK: "ok  ", NOTE: "note", FAIL: "FAIL"}[self.status]
        return f"  {mark}  {self.name}: {self.detail}" + (f" -> fix: {self.fix}" if self.fix else "")


@dataclass
class Certificate:
    """What `certify` found: the checks in order, the family, the parser (its name and the function), the text of the
    template it used and its `renderer` (without tools), the conformance and the
    turn budget."""

    model: str
    checks: List[Check] = field(default_factory=list)
    family: Optional[Family] = None
    parser_name: Optional[str] = None
    parse: Optional[Callable] = field(default=None, repr=False)
    chat_template: Optional[str] = None
    renderer: Optional[ChatRenderer] = field(default=None, repr=False)
    conformance: Optional[Conformance] = None
    turn_budget: Optional[int] = None

    @property
    def works(self) -> bool:
        """No check failed."""
        return all(check.status != FAIL for check in self.checks)

    @property
    def failures(self) -> List[Check]:
        return [check for check in self.checks if check.status == FAIL]

    def verdict(self) -> str:
        """One line: the model works (with its parser), or the first failure and its fix."""
        if self.works:
            notes = sum(check.status == NOTE for check in self.checks)
            return f"{self.model}: works for JSON tool calls (parser {self.parser_name!r}" + (f", {notes} note(s) above)" if notes else ")")
        first = self.failures[0]
        return f"{self.model} cannot train with JSON tool calls: {first.name}: {first.detail}" + (f"; fix: {first.fix}" if first.fix else "")

    def report(self) -> str:
        """Every check on its own line, then the verdict."""
        return "\n".join([f"check-model {self.model}", *(check.line() for check in self.checks), self.verdict()])


def certify(
    tokenizer,
    model: str = "the model",
    chat_template: Optional[str] = None,
    tool_parser=None,
    schemas: Optional[List[dict]] = None,
    stop_token_ids: Iterable[int] = (),
) -> Certificate:
    """Check that `tokenizer`'s chat template (or `chat_template`) and `tool_parser` can run JSON tool calls.

    Args:
        tokenizer: the model's tokenizer (nothing else is loaded).
        model (`str`): the name printed in the report.
        chat_template (`str`, *optional*): a template to use instead of the tokenizer's (``--chat_template``).
        tool_parser (`str` or `Callable`, *optional*): the parser (``--tool_parser``); default: the family's, or the
            one the template's text calls for.
        schemas (`list[dict]`, *optional*): the tools' JSON schemas (default: a calculator).
        stop_token_ids (`Iterable[int]`): ids generation also stops at (the model's ``generation_config``).

    Returns:
        `Certificate`: every check; `Certificate.works` is False when the model cannot work.
    """
    certificate = Certificate(model)
    schemas = list(schemas or [SAMPLE_SCHEMA])
    renderer = _template_checks(certificate, tokenizer, chat_template)
    if renderer is None:
        return certificate
    renderer = renderer.with_tools(schemas)
    _parser_check(certificate, tool_parser)
    _round_trip_check(certificate, renderer, schemas[0])
    certificate.conformance = check_conformance(renderer)
    _conformance_check(certificate)
    stops = set(stop_token_ids) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    _stop_check(certificate, tokenizer, renderer, stops)
    _call_stop_check(certificate, tokenizer, renderer, schemas[0], stops)
    _thinking_check(certificate, renderer)
    if certificate.works:
        certificate.turn_budget = call_budget(renderer, schemas)
        certificate.checks.append(Check("turn budget", OK, f"a call to the longest tool needs about {certificate.turn_budget} new tokens a turn"))
    return certificate


def _template_checks(certificate: Certificate, tokenizer, chat_template: Optional[str]) -> Optional[ChatRenderer]:
    """The template and its family; the renderer, or `None` after a failure."""
    if not (chat_template or getattr(tokenizer, "chat_template", None)):
        certificate.checks.append(Check("template", FAIL, "the tokenizer has no chat template", "--chat_template FILE (a Jinja template that renders tools)"))
        return None
    try:
        chosen = tool_chat_template(tokenizer, chat_template)
    except NoToolTemplate as error:
        certificate.checks.append(Check("template", FAIL, error.reason, "--chat_template FILE (a Jinja template that renders tools)"))
        return None
    certificate.chat_template = chosen or tokenizer.chat_template
    if chat_template and not template_takes_tools(tokenizer, chat_template):
        certificate.checks.append(Check("template", FAIL, "the --chat_template ignores tools= (it never describes the tools to the model)",
                                        "--chat_template FILE (a template that renders tools)"))
        return None
    source = "--chat_template" if chat_template else "the tokenizer's own"
    if chosen == CHATML_TOOLS_TEMPLATE and not chat_template:
        source = "textenv's ChatML tool template (the tokenizer's own ignores tools=)"
    recognised = recognise_family(certificate.chat_template, getattr(tokenizer, "all_special_tokens", ()))
    certificate.family = recognised.family if recognised else None
    family = f"{recognised.family.display_name} ({recognised.matched} match)" if recognised else "no known family (read by its markers)"
    if chosen == CHATML_TOOLS_TEMPLATE and not chat_template:
        certificate.family, family = None, "ChatML, with textenv's Hermes tool calls"
    certificate.checks.append(Check("template", OK, f"{source}; family: {family}"))
    try:
        certificate.renderer = ChatRenderer(tokenizer, chat_template=chosen)
    except ChatTemplateError as error:
        certificate.checks.append(Check("template", FAIL, str(error), "--chat_template FILE"))
    return certificate.renderer


def _parser_check(certificate: Certificate, tool_parser) -> None:
    if tool_parser is not None:
        name, how = (tool_parser if isinstance(tool_parser, str) else getattr(tool_parser, "__name__", "custom")), "--tool_parser"
    elif certificate.family is not None and certificate.family.parser in TOOL_CALL_PARSERS:
        name, how = certificate.family.parser, f"{certificate.family.display_name}'s format"
    else:
        name, how = parser_for_template(certificate.chat_template), "read from the template's text"
    certificate.parser_name = name
    certificate.parse = get_tool_call_parser(tool_parser if tool_parser is not None else name)
    certificate.checks.append(Check("tool-call format", OK, f"parser {name!r} ({how})"))


def _conformance_check(certificate: Certificate) -> None:
    conformance = certificate.conformance
    errors = [step for step in conformance.steps if step.error]
    if errors:
        step = errors[0]
        certificate.checks.append(Check("append-only", FAIL, f"the template raises on a {step.role} turn: {step.error}",
                                        "--chat_template FILE (one that renders tool calls and tool results)"))
    elif conformance.append_only:
        certificate.checks.append(Check("append-only", OK, conformance.summary()))
    else:
        certificate.checks.append(Check("append-only", NOTE, conformance.summary()))


def _round_trip_check(certificate: Certificate, renderer: ChatRenderer, schema: dict) -> None:
    """A sample call rendered as the template writes it, then read back by the parser. A template that writes the call
    right only from arguments given as a JSON string (Mistral v7's ``'...' + (arguments|tojson|safe)`` HTML-escapes
    the text around a mapping) gets them so from then on: `ChatRenderer.arguments_as_json`."""
    question, call = sample_call(schema)
    name, arguments = call["tool_calls"][0]["function"]["name"], sample_arguments(schema)
    try:
        written = _written_call(renderer, question, call)
    except Exception as error:  # noqa: BLE001 - a template that cannot render a call is the finding
        certificate.checks.append(Check("tool call", FAIL, f"the template cannot render an assistant tool call ({type(error).__name__}: {error})",
                                        "--chat_template FILE (one that renders tool_calls)"))
        return
    if name not in written:
        certificate.checks.append(Check("tool call", FAIL, "the template drops an assistant message's tool_calls (the call is not in its text)",
                                        "--chat_template FILE (one that renders tool_calls; TRL ships training templates for many families)"))
        return
    read = [(c.name, c.arguments) for c in certificate.parse(written).calls]
    if read != [(name, arguments)] and not renderer.arguments_as_json:
        renderer.arguments_as_json = True
        as_json = _written_call(renderer, question, call)
        if [(c.name, c.arguments) for c in certificate.parse(as_json).calls] == [(name, arguments)]:
            certificate.renderer.arguments_as_json = True
            certificate.checks.append(Check("tool call", OK, f"read back by {certificate.parser_name!r} from arguments given as a JSON string, as textenv "
                                            f"gives them to this template (it mangles a mapping's call): {as_json.strip()!r}"))
            return
        renderer.arguments_as_json = False
    if read == [(name, arguments)]:
        certificate.checks.append(Check("tool call", OK, f"a call rendered by the template and read back by {certificate.parser_name!r}: {written.strip()!r}"))
        return
    readers = [other for other, parse in TOOL_CALL_PARSERS.items() if [(c.name, c.arguments) for c in parse(written).calls] == [(name, arguments)]]
    fix = f"--tool_parser {readers[0]}" if readers else "--tool_parser with a callable text -> ParsedTurn (no built-in parser reads it)"
    found = [(c.name, c.arguments, c.error) for c in certificate.parse(written).calls]
    certificate.checks.append(Check("tool call", FAIL, f"parser {certificate.parser_name!r} read {found} from the template's call {written.strip()!r}", fix))


def _written_call(renderer: ChatRenderer, question: Messages, call: dict) -> str:
    """What the template writes for `call` after `question`'s generation prompt, without the closing of a reply."""
    written = renderer.added_text(question, [call])
    prompt = renderer.generation_prompt(question)
    written = written[len(prompt):] if written.startswith(prompt) else written
    suffix = renderer.assistant_suffix(question)
    return written[: -len(suffix)] if suffix and written.endswith(suffix) else written


def sample_call(schema: dict) -> tuple[Messages, dict]:
    """A question and an assistant message calling `schema`'s tool with `sample_arguments` (call id of 9 characters,
    as Mistral's v7 template requires)."""
    function = {"name": schema.get("function", schema)["name"], "arguments": sample_arguments(schema)}
    question: Messages = [{"role": "user", "content": "What is (17 + 25) * 3?"}]
    return question, {"role": "assistant", "content": "", "tool_calls": [{"id": "call0a1b2", "type": "function", "function": function}]}


SAMPLE_VALUES = {"integer": 42, "number": 2.5, "boolean": True, "array": [1, "two"], "object": {"nested": ["é", 1]}, "null": None}


def sample_arguments(schema: dict) -> dict:
    """One value per parameter of `schema`, of its JSON type (a non-ASCII string where the type is a string or not
    given)."""
    properties = (schema.get("function", schema).get("parameters") or {}).get("properties") or {}
    return {name: copy.deepcopy(SAMPLE_VALUES.get(spec.get("type"), SAMPLE_ARGUMENT)) if isinstance(spec, dict) else SAMPLE_ARGUMENT
            for name, spec in properties.items()}


def _stop_check(certificate: Certificate, tokenizer, renderer: ChatRenderer, stops: set) -> None:
    """The text closing a reply must start with a token generation stops at (`stops`: the eos ids)."""
    suffix = renderer.assistant_suffix([{"role": "user", "content": "?"}])
    ids = renderer.encode(suffix).tolist()
    if ids and ids[0] in stops:
        certificate.checks.append(Check("stop token", OK, f"a reply ends at {tokenizer.convert_ids_to_tokens(ids[0])!r} (id {ids[0]}), which ends generation"))
        return
    closing = tokenizer.convert_ids_to_tokens(ids[0]) if ids else None
    if closing is None:
        certificate.checks.append(Check("stop token", NOTE, f"the template closes a reply with nothing; generation stops at eos {tokenizer.eos_token!r}"))
        return
    certificate.checks.append(Check("stop token", FAIL,
                                    f"the template closes a reply with {closing!r}, but generation stops only at {sorted(stops)}",
                                    f"set tokenizer.eos_token = {closing!r} (or add its id to generation_config.eos_token_id)"))


def _call_stop_check(certificate: Certificate, tokenizer, renderer: ChatRenderer, schema: dict, stops: set) -> None:
    """After a tool call, generation must stop before the template's text for the tool's result: a model that writes
    on would invent the result itself. Gemma 4 ends a call turn at ``<|tool_response>``, GPT-OSS at ``<|call|>``,
    GLM-4.5 at the ``<|observation|>`` that opens the result; only their generation configs list those ids."""
    if not certificate.works:
        return
    question, call = sample_call(schema)
    result = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "name": call["tool_calls"][0]["function"]["name"], "content": _RESULT}
    try:
        text = renderer.added_text(question, [call, result])
    except ChatTemplateError as error:
        certificate.checks.append(Check("stop after a call", NOTE, f"not checked: {error}"))
        return
    if _RESULT not in text:  # without the result's place there is nothing to check against
        certificate.checks.append(Check("stop after a call", NOTE, "not checked: the template does not write a tool result's content"))
        return
    prompt = renderer.generation_prompt(question)
    before_result = text[len(prompt) if text.startswith(prompt) else 0 : text.index(_RESULT)]
    ids = renderer.encode(before_result).tolist()
    stop = next((token for token in ids if token in stops), None)
    if stop is not None:
        certificate.checks.append(Check("stop after a call", OK, f"a call turn ends at {tokenizer.convert_ids_to_tokens(stop)!r} (id {stop}), which ends generation"))
        return
    ends = [token for token in (certificate.family.stop if certificate.family else ()) if token in before_result]
    named = ", ".join(f"{token!r} (id {tokenizer.convert_tokens_to_ids(token)})" for token in ends) or "the token that ends a call turn"
    certificate.checks.append(Check("stop after a call", FAIL,
                                    f"after a call the template writes {before_result[-40:]!r} before the tool's result, but generation stops at "
                                    f"none of its tokens (only at {sorted(stops)}): the model would write the result itself",
                                    f"add {named} to generation_config.eos_token_id (or generation_kwargs' eos_token_id)"))


def _thinking_check(certificate: Certificate, renderer: ChatRenderer) -> None:
    """Whether the template keeps a reply's thinking once a later user turn follows it."""
    family = certificate.family
    if family is None or not family.thinking:
        return
    opening, closing = family.thinking
    thought = "first the sum, then the product"
    conversation = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": f"{opening}{thought}{closing}5"},
                    {"role": "user", "content": "And 4*5?"}]
    try:
        kept = thought in renderer.render(conversation)
    except Exception as error:  # noqa: BLE001 - a template may refuse the shape; say so, it is not fatal
        certificate.checks.append(Check("thinking", NOTE, f"not checked: the template raised {type(error).__name__}: {error}"))
        return
    if kept:
        certificate.checks.append(Check("thinking", OK, f"{opening}...{closing} is kept in earlier turns"))
        return
    training = f"; TRL's {family.training_template!r} template keeps it (--chat_template)" if family.training_template else ""
    certificate.checks.append(Check("thinking", NOTE, f"the template strips {opening}...{closing} from earlier turns: textenv renders later "
                                    f"turns after a stand-in (ChatRenderer.added_text), so the sampled ids are trained as sampled{training}"))
