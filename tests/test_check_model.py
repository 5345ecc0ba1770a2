"""`textenv check-model` and `certify`: the verdict on each real chat template, each check's finding, the fixes it
names, the command's output and exit status, and runs that stop before any episode when a model cannot work.

Comparisons: exact (verdicts, parser names, which checks pass). The real templates are worn by the bundled tokenizer
with the family's special tokens (`tests/chat_fixtures.py`); the certificate reads only the tokenizer and template.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from chat_fixtures import REAL_TEMPLATES, family_stop_ids, real_template, real_template_tokenizer
from textenv.chat.certificate import FAIL, NOTE, OK, certify
from textenv.chat.families import FAMILIES_BY_NAME
from textenv.chat.template_hashes import KNOWN_TEMPLATES
from textenv.chat.tool_chat import ChatTools
from textenv.cli import main, run_command

ROOT = Path(__file__).resolve().parents[1]

# Per real template: the parser of a model that works, or the check that fails (the rest work).
FAILS = {
    "deepseek_r1_distill": "template", "deepseek_r1_distill_training": "template",  # ignore tools=
    "deepseekv3": "template", "deepseekv3_training": "template",
    "gemma3": "template", "gemma3_training": "template",
    "phi3_5": "template", "phi3_5_training": "template", "phi4_mini": "template",
    "lfm2": "tool call", "lfm2_training": "tool call",  # drop an assistant message's tool_calls
}
PARSER = {"gemma4": "gemma4", "glm4moe": "glm4", "gptoss": "gpt_oss", "lfm2_2_5": "pythonic", "lfm2_v2": "pythonic",
          "llama3_1": "llama3", "llama3_2": "llama3", "mistral_v13_tekken": "mistral", "mistral_v7_tekken": "mistral", "nemotron_3_nano": "qwen3_coder",
          "qwen2_5": "hermes", "qwen3": "hermes", "qwen3_5_nothink": "qwen3_coder", "qwen3_5_think": "qwen3_coder"}


def released(name: str) -> str:
    return name.removesuffix("_training")


@pytest.fixture(scope="module")
def certificates():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: certify_real(name) for name in REAL_TEMPLATES}


def certify_real(name: str, **options):
    """The certificate of the real template `name` on its test tokenizer, told its family's eos ids as a released
    generation config lists them."""
    tokenizer = real_template_tokenizer(name)
    family = FAMILIES_BY_NAME[dict(KNOWN_TEMPLATES.values())[name]]
    return certify(tokenizer, model=name, stop_token_ids=family_stop_ids(tokenizer, family), **options)


@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_the_verdict_on_each_real_template(name, certificates):
    certificate = certificates[name]
    if name in FAILS:
        assert not certificate.works and certificate.failures[0].name == FAILS[name], certificate.report()
        assert certificate.failures[0].fix and "cannot train" in certificate.verdict()
        return
    assert certificate.works, certificate.report()
    assert certificate.parser_name == PARSER[released(name).replace("gemma4_v5", "gemma4")]
    assert [check.name for check in certificate.checks][-1] == "turn budget" and certificate.turn_budget >= 48
    round_trip = next(check for check in certificate.checks if check.name == "tool call")
    assert round_trip.status == OK and "Calculator" in round_trip.detail


def test_a_template_that_strips_thinking_gets_a_note_naming_trls_training_template(certificates):
    thinking = next(check for check in certificates["qwen3"].checks if check.name == "thinking")
    assert thinking.status == NOTE and "strips" in thinking.detail and "'qwen3_training'" in thinking.detail
    assert next(check for check in certificates["qwen3_training"].checks if check.name == "thinking").status == OK


def test_a_template_that_mangles_a_mappings_call_gets_json_string_arguments(certificates):
    """Mistral v7 writes `'{"name": "' + name + '", "arguments": ' + (arguments|tojson|safe)`: the markup-safe value turns
    the concatenation into HTML-escaped text (`{&#34;name&#34;: ...`); from a JSON string it writes the call right."""
    certificate = certificates["mistral_v7_tekken"]
    assert certificate.renderer.arguments_as_json and not certificates["mistral_v13_tekken"].renderer.arguments_as_json
    round_trip = next(check for check in certificate.checks if check.name == "tool call")
    assert "JSON string" in round_trip.detail and '[TOOL_CALLS][{"name": "Calculator", "arguments": {"query": ' in round_trip.detail
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}
    assert '{"name": "f", "arguments": {"a": 1}, "id": "abcdefghi"}' in certificate.renderer.render([{"role": "user", "content": "?"}, call])


def test_a_parser_that_does_not_read_the_template_names_the_one_that_does():
    certificate = certify(real_template_tokenizer("qwen2_5"), tool_parser="llama3")
    (failure,) = certificate.failures
    assert failure.name == "tool call" and failure.fix == "--tool_parser hermes"


def test_a_tokenizer_without_a_chat_template_fails_first(tokenizer):
    import copy

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = None
    certificate = certify(tokenizer)
    assert [check.status for check in certificate.checks] == [FAIL] and "--chat_template" in certificate.failures[0].fix


def test_a_template_that_raises_on_tool_messages_fails_with_the_error(tokenizer):
    raising = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
               "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    certificate = certify(tokenizer, chat_template=raising)
    assert [failure.name for failure in certificate.failures] == ["tool call", "append-only"]  # it drops calls too
    assert "no tool role" in certificate.failures[1].detail


def test_a_reply_closed_by_a_token_generation_does_not_stop_at_fails(tokenizer):
    import copy

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.eos_token = "<|endoftext|>"
    certificate = certify(tokenizer)
    (failure,) = certificate.failures
    assert failure.name == "stop token" and failure.fix.startswith("set tokenizer.eos_token = '<|im_end|>'")
    assert certify(tokenizer, stop_token_ids=[tokenizer.convert_tokens_to_ids("<|im_end|>")]).works


@pytest.mark.parametrize("name, token", [("gemma4", "<|tool_response>"), ("gptoss", "<|call|>"), ("glm4moe", "<|observation|>")])
def test_a_call_turn_generation_would_not_stop_fails_naming_the_token_the_generation_config_needs(name, token):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = real_template_tokenizer(name)
        certificate = certify(tokenizer, model=name)  # stops at the tokenizer's eos only
        assert certify_real(name).works
    (failure,) = certificate.failures
    assert failure.name == "stop after a call" and "would write the result itself" in failure.detail
    assert failure.fix.startswith(f"add {token!r} (id {tokenizer.convert_tokens_to_ids(token)}) to generation_config.eos_token_id")


def test_a_run_is_checked_with_the_models_generation_config_and_the_runs_eos_ids():
    from textenv.environment import TextEnvironment
    from textenv.gym import GymScheduler
    from textenv.models import tiny_causal_lm
    from textenv.tools import Calculator

    tokenizer = real_template_tokenizer("gemma4")
    model = tiny_causal_lm(vocab_size=len(tokenizer))
    tools = {"Calculator": Calculator()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Gemma 4's template is not append-only: said so
        with pytest.raises(ValueError, match="stop after a call: .*'<\\|tool_response>'"):
            TextEnvironment(model, tokenizer, tools, None, "", tool_format="json")
        ends = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|tool_response>")]
        assert TextEnvironment(model, tokenizer, tools, None, "", tool_format="json", generation_kwargs={"eos_token_id": ends})._chat_tools
        model.generation_config.eos_token_id = ends
        assert TextEnvironment(model, tokenizer, tools, None, "", tool_format="json")._chat_tools.certificate.works
        assert GymScheduler(model, tokenizer, gym_env="family_drift").chat_tools().certificate.works
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        with pytest.raises(ValueError, match="stop after a call"):
            GymScheduler(model, tokenizer, gym_env="family_drift").chat_tools()


def test_chat_tools_refuses_a_model_that_cannot_work_with_the_verdict():
    with pytest.raises(ValueError, match="cannot train with JSON tool calls: tool call: the template drops"):
        ChatTools(real_template_tokenizer("lfm2"))


def test_the_command_prints_every_check_and_the_verdict(capsys):
    assert main(["check-model", "bundled"]) == 0
    output = capsys.readouterr().out
    for name in ("template", "tool-call format", "append-only", "tool call", "stop token", "turn budget"):
        assert f"  ok    {name}: " in output
    assert output.rstrip().endswith("bundled: works for JSON tool calls (parser 'hermes')")


def test_the_command_exits_1_when_the_model_cannot_work(tmp_path, capsys):
    template = tmp_path / "lfm2.jinja"
    template.write_text(real_template("lfm2"))
    with pytest.raises(SystemExit) as exit_info:
        main(["check-model", "bundled", "--chat_template", str(template)])
    assert exit_info.value.code == 1
    assert "FAIL  tool call: the template drops" in capsys.readouterr().out


def test_the_command_describes_the_tools_of_a_trl_environment_class(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    certificate = run_command(["check-model", "bundled", "--tools", "examples/counter_env.py:CounterEnv"])
    round_trip = next(check for check in certificate.checks if check.name == "tool call")
    assert '"name": "increment", "arguments": {"step": 42}' in round_trip.detail and certificate.works


def test_a_run_with_a_model_that_cannot_work_stops_before_any_episode(tmp_path, capsys):
    template = tmp_path / "phi.jinja"
    template.write_text(real_template("phi3_5"))
    argv = ["train", "--task", "calculator", "--tool_format", "json", "--chat_template", str(template), "--model_name_or_path", "tiny",
            "--ppo_steps", "1", "--batch_size", "2", "--output_dir", str(tmp_path / "run")]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("textenv train: error: the model cannot train with JSON tool calls: template: ") and error.count("\n") == 1
    assert not (tmp_path / "run" / "episodes.jsonl").exists()


def test_the_your_model_page_shows_what_the_command_prints(capsys):
    page = (ROOT / "docs" / "guides" / "models.md").read_text()
    assert "```bash\ntextenv check-model bundled\n```" in page
    shown = page.split("```text\n", 1)[1].split("```", 1)[0]
    assert main(["check-model", "bundled"]) == 0
    assert capsys.readouterr().out == shown


def test_a_template_that_drops_tool_results_is_not_checked_for_the_stop_after_a_call(tokenizer):
    from textenv.chat.templates import CHATML_TOOLS_TEMPLATE

    hidden = CHATML_TOOLS_TEMPLATE.replace("'\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>'", "'\\n<tool_response/>'")
    assert hidden != CHATML_TOOLS_TEMPLATE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        certificate = certify(tokenizer, chat_template=hidden)
    check = next(check for check in certificate.checks if check.name == "stop after a call")
    assert check.status == NOTE and "does not write a tool result's content" in check.detail
