"""Shared by tests/test_family_drift.py: a tool conversation scripted in each family's own format, the two front ends
that play it (a Gym `Env` offering `tool_schemas`, and `TextEnvironment(tool_format="json")`), the policy that emits
the scripted ids (or records an engine's), and the exact comparisons of what was emitted with what was trained.

A family's tool call is written as its real template writes it (the template's rendering of an assistant tool-call
message, after the generation prompt), ended by the token its model stops at; a reply's ids may be made
non-canonical (`split_a_word`): the same text, in two tokens where the tokenizer writes one.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch

from chat_fixtures import family_stop_ids
from family_tokenizers import family_of, family_tokenizer
from textenv.chat.renderer import with_json_arguments
from textenv.engine.engine import FINISH_EOS, Completion
from textenv.environment import TextEnvironment
from textenv.gym import Env, GymScheduler
from textenv.gym.registry import envs
from textenv.models import tiny_causal_lm
from textenv.tools import Calculator
from textenv.tools.json_calls import JsonToolCalls

SYSTEM = "You answer with the calculator."
QUESTION = "What is seventeen times twenty-three?"
SECOND = "And minus one?"
ANSWER = "It is three hundred ninety-one."
LAST = "Three hundred ninety."
THOUGHT = "adding up"
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call00001", "type": "function", "function": {"name": "Calculator", "arguments": {"query": "17*23"}}}]}
OPENING = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]

# The token a family's model ends a tool-call turn and a reply with: the one its template writes there or, where it
# writes none (GLM-4.5), the next message's role token. Each is an eos id of the released generation config (Gemma 4's
# [1, 106, 50] holds <|tool_response>, 50; GLM-4.5's <|user|> and <|observation|>) and is in `Family.stop`.
STOPS = {"qwen2_5": ("<|im_end|>",) * 2, "qwen3": ("<|im_end|>",) * 2, "qwen3_5": ("<|im_end|>",) * 2,
         "nemotron_3_nano": ("<|im_end|>",) * 2, "llama3": ("<|eot_id|>",) * 2, "mistral": ("</s>",) * 2,
         "lfm2": ("<|im_end|>",) * 2, "lfm2_5": ("<|im_end|>",) * 2, "gpt_oss": ("<|call|>", "<|return|>"),
         "gemma4": ("<|tool_response>", "<turn|>"), "glm4_moe": ("<|observation|>", "<|user|>")}
# A reply with thinking, as each thinking family's model writes it after the generation prompt (Qwen3.5's and
# Nemotron's open the thinking block themselves; Qwen3.5's small-model template closes it: no thinking).
THINKING = {"qwen3": f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}", "qwen3_5_think": f"{THOUGHT}\n</think>\n\n{ANSWER}",
            "nemotron_3_nano": f"{THOUGHT}\n</think>{ANSWER}", "glm4moe": f"\n<think>{THOUGHT}</think>\n{ANSWER}",
            "gemma4": f"<|channel>thought\n{THOUGHT}<channel|>{ANSWER}", "gemma4_v5": f"<|channel>thought\n{THOUGHT}<channel|>{ANSWER}",
            "gptoss": f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}",
            "lfm2_2_5": f"<think>{THOUGHT}</think>{ANSWER}"}
# Templates that run on the tokenizer of another template, passed as chat_template=: a second template of a family, and
# Qwen3's and Qwen3.5's on Qwen2.5's (the same vocabulary, nothing added, the same eos). Each tokenizer costs a copy of
# its vocabulary, twice (its own and the renderer's); ChatTools checks the template passed.
SHARED_TOKENIZER = {"llama3_2": "llama3_1", "gemma4": "gemma4_v5", "qwen3": "qwen2_5", "qwen3_5_think": "qwen2_5",
                    "qwen3_5_nothink": "qwen2_5", "mistral_v7_tekken": "mistral_v13_tekken", "lfm2": "lfm2_v2"}
# Templates that write a call right only from arguments given as a JSON string (Mistral v7 HTML-escapes the text
# around a mapping's `arguments|tojson|safe`): their model writes what the template writes from one.
JSON_ARGUMENTS = {"mistral_v7_tekken"}
REWRITTEN_STOPS = {"<|return|>": "<|end|>"}  # GPT-OSS's template closes a final answer so once a message follows
QUERIES: list = []  # what the calculator was asked, by either front end


def tokenizer_for(template: str):
    """The family tokenizer `template` runs on (with `real_template(template)` passed as chat_template=)."""
    return family_tokenizer(SHARED_TOKENIZER.get(template, template))


def stop_ids(template: str) -> list:
    """The eos ids a run of `template`'s family is given (its generation config's)."""
    return family_stop_ids(tokenizer_for(template), family_of(template))


class RecordingCalculator(Calculator):
    """The calculator, keeping every query it is asked."""

    def __call__(self, query):
        QUERIES.append(query)
        return super().__call__(query)


SCHEMAS = JsonToolCalls({"Calculator": RecordingCalculator()}).schemas()


class DriftEnv(Env):
    """Answers the calculator's calls, asks one follow-up question after the first plain reply, ends after the next."""

    tool_schemas = SCHEMAS

    async def reset(self, config):
        return QUESTION, {}, SYSTEM

    async def step(self, action):
        if action[-1].get("tool_calls"):
            messages, records = JsonToolCalls({"Calculator": RecordingCalculator()}).answer(action[-1]["tool_calls"])
            return messages, 0.0, False, {"tool_calls": [record.as_dict() for record in records]}
        if any(message["role"] == "user" and message["content"] == SECOND for message in action):
            return None, 1.0, True, {}
        return SECOND, 0.0, False, {}

    async def close(self):
        pass


envs["family_drift"] = DriftEnv


# ---------------------------------------------------------------------------------------------- the scripted policy
@dataclass
class Turn:
    ids: list
    canonical: bool  # the tokenizer's own encoding of the turn's text


class ScriptedIds:
    """Emits the scripted turns' ids in order (as a `GymScheduler` policy or an engine's `generate`), ended by a stop
    id as the engine ends a turn; keeps each context it was given and each turn it emitted."""

    def __init__(self, tokenizer, turns, finish_reason: str = FINISH_EOS):
        self.tokenizer, self.turns, self.finish_reason, self.contexts, self.emitted = tokenizer, list(turns), finish_reason, [], []

    def next(self, context) -> Completion:
        ids = torch.tensor(self.turns[len(self.emitted)].ids, dtype=torch.long)
        self.contexts.append(context.tolist())
        self.emitted.append(ids.tolist())
        return Completion(ids, self.tokenizer.decode(ids, skip_special_tokens=False), self.finish_reason)

    def __call__(self, contexts, stop_strings=()):
        return [self.next(context) for context in contexts]


def encode(tokenizer, text: str) -> list:
    return tokenizer(text, add_special_tokens=False).input_ids


def token_id(tokenizer, token: str) -> int:
    (found,) = encode(tokenizer, token)
    return found


def split_a_word(tokenizer, ids: list, word: str = "hundred") -> list:
    """`ids` with the token that holds `word` replaced by two tokens of the vocabulary that decode to the same text."""
    pieces = tokenizer.convert_ids_to_tokens(ids)
    index = next(index for index, piece in enumerate(pieces) if word in piece)
    piece = pieces[index]
    for cut in range(len(piece) - 2, 0, -1):
        halves = tokenizer.convert_tokens_to_ids([piece[:cut], piece[cut:]])
        if None not in halves and tokenizer.convert_ids_to_tokens(halves) == [piece[:cut], piece[cut:]]:
            return ids[:index] + halves + ids[index + 1 :]
    raise AssertionError(f"no split of {piece!r} in the vocabulary")


def written_by_template(tokenizer, chat_template: str, message: dict) -> str:
    """What `chat_template` writes for `message` after the opening's generation prompt (from where the two renders
    part: Nemotron's prompt opens `<think>\\n`, its rendered reply `<think></think>`)."""
    prompt = tokenizer.apply_chat_template(OPENING, tools=SCHEMAS, tokenize=False, add_generation_prompt=True, chat_template=chat_template)
    full = tokenizer.apply_chat_template([*OPENING, message], tools=SCHEMAS, tokenize=False, chat_template=chat_template)
    common = next((index for index, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
    return full[common:]


def model_turn(tokenizer, text: str, stop: str, canonical: bool = True) -> Turn:
    """The ids of `text` ended by the stop token (the template's closing after it, if any, left to the template)."""
    trimmed = text.rstrip("\n")
    body = trimmed[: -len(stop)] if trimmed.endswith(stop) else text
    ids = encode(tokenizer, body)
    return Turn((ids if canonical else split_a_word(tokenizer, ids)) + [token_id(tokenizer, stop)], canonical)


@functools.cache
def scripted_turns(template: str, chat_template: str, gym: bool) -> tuple:
    """A tool call as the template writes it; a reply (with thinking where the family thinks), non-canonical; in the Gym,
    the reply to the second question, non-canonical."""
    tokenizer, family = tokenizer_for(template), family_of(template)
    call_stop, reply_stop = STOPS[family.name]
    call_message = with_json_arguments([CALL])[0] if template in JSON_ARGUMENTS else CALL
    call = model_turn(tokenizer, written_by_template(tokenizer, chat_template, call_message), call_stop)
    plain = written_by_template(tokenizer, chat_template, {"role": "assistant", "content": ANSWER})
    reply = model_turn(tokenizer, THINKING.get(template, plain), reply_stop, canonical=False)
    last = written_by_template(tokenizer, chat_template, {"role": "assistant", "content": LAST})
    return (call, reply, model_turn(tokenizer, last, reply_stop, canonical=False)) if gym else (call, reply)


# ---------------------------------------------------------------------------------------------- the two front ends
@functools.cache
def tiny_model():
    return tiny_causal_lm(seed=0)  # TextEnvironment needs a model; the script generates instead of it


def gym_episode(template: str, chat_template: str, turns: list):
    """`(script, episode, renderer)` of one Gym episode of `DriftEnv` played by `turns`."""
    tokenizer = tokenizer_for(template)
    script = ScriptedIds(tokenizer, turns)
    scheduler = GymScheduler(None, tokenizer, policy=script, gym_env="family_drift", max_turns=len(turns) + 1,
                             loss_scale="all", chat_template=chat_template, generation_kwargs={"eos_token_id": stop_ids(template)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a template that rewrites earlier turns is said so
        (episode,) = scheduler.run([{"query": QUESTION}])
    assert episode.errors == [] and episode.finish_reason == "done"
    return script, episode, scheduler.chat_tools().renderer_for(SCHEMAS)


def text_environment_episode(template: str, chat_template: str, turns: list):
    """`(script, run outputs, renderer)` of one `TextEnvironment(tool_format="json")` episode played by `turns`."""
    tokenizer = tokenizer_for(template)
    script = ScriptedIds(tokenizer, turns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = TextEnvironment(tiny_model(), tokenizer, {"Calculator": RecordingCalculator()}, None, SYSTEM,
                              generation_kwargs={"eos_token_id": stop_ids(template)}, tool_format="json", chat_template=chat_template)

    async def generate(context_ids, stop_strings=(), generation_kwargs=None, *, episode=None):
        return script.next(context_ids)

    env._engine.generate = generate
    outputs = env.run([QUESTION])
    return script, outputs, env._chat_tools.renderer_for(SCHEMAS)


# ---------------------------------------------------------------------------------------------- the assertions
def model_segments(history) -> list:
    return [history.tokens[start:end].tolist() for (start, end), system in zip(history.token_spans, history.system_spans) if not system]


def assert_trained_as_emitted(script: ScriptedIds, history) -> None:
    """(1) trained segments = emitted ids per turn; (2) mask 1 exactly on them; (3) contexts grow by appending."""
    assert model_segments(history) == script.emitted
    for (context, emitted), following in zip(zip(script.contexts, script.emitted), script.contexts[1:]):
        assert following[: len(context) + len(emitted)] == context + emitted
    end = len(script.contexts[-1]) + len(script.emitted[-1])
    assert history.tokens[:end].tolist() == script.contexts[-1] + script.emitted[-1]
    expected = [0] * len(history.tokens)
    for context, emitted in zip(script.contexts, script.emitted):
        expected[len(context) : len(context) + len(emitted)] = [1] * len(emitted)
    assert history.token_masks.tolist() == expected


def assert_template_text_between_turns(script: ScriptedIds, messages, tokenizer, chat_template) -> None:
    """(5) The first context is the template's rendering of the opening; what textenv put after each turn (after its
    stop token: the closing, the next messages, the generation prompt) is what the template renders after that token
    (GPT-OSS's final `<|return|>` as the `<|end|>` it becomes once a message follows)."""
    def render(conversation):
        return tokenizer.apply_chat_template(conversation, tools=SCHEMAS, tokenize=False, add_generation_prompt=True,
                                             chat_template=chat_template)

    starts = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
    assert tokenizer.decode(script.contexts[0], skip_special_tokens=False) == render(messages[: starts[0]])
    for turn, following in enumerate(script.contexts[1:]):
        stop = tokenizer.decode(script.emitted[turn][-1:], skip_special_tokens=False)
        after = tokenizer.decode(following[len(script.contexts[turn]) + len(script.emitted[turn]) :], skip_special_tokens=False)
        assert render(messages[: starts[turn + 1]]).endswith(REWRITTEN_STOPS.get(stop, stop) + after)


def assert_the_call_ran(messages) -> None:
    """(4) The calculator was asked the call's query once, and its result is the tool message."""
    assert QUERIES == ["17*23"]
    assert [message["content"] for message in messages if message["role"] == "tool"] == ["391"]


class FollowUpEnv(DriftEnv):
    """Answers calls; otherwise asks the model to go on, three replies in all."""

    async def step(self, action):
        if action[-1].get("tool_calls"):
            return await super().step(action)
        replies = sum(message["role"] == "assistant" for message in action)
        return (None, 1.0, True, {}) if replies >= 3 else ("Go on.", 0.0, False, {})


envs["family_drift_follow_up"] = FollowUpEnv


def recording(engine) -> ScriptedIds:
    """Wrap the engine's generate to keep every context it is given and the ids of every completion it returns."""
    played = ScriptedIds(None, [])
    real = engine.generate

    async def generate(context_ids, *args, **kwargs):
        completion = await real(context_ids, *args, **kwargs)
        played.contexts.append(context_ids.tolist())
        played.emitted.append(completion.token_ids.tolist())
        return completion

    engine.generate = generate
    return played
