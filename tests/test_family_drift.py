"""Zero drift, per model family: the ids a policy emits are the ids trained, on every family's real chat template and
(real or stand-in) vocabulary, through both front ends.

For each vendored real template textenv accepts for JSON tool calls (`certify(...).works`), a scripted policy plays a
Gym episode (`GymScheduler`, an `Env` offering `tool_schemas`) and a `TextEnvironment(tool_format="json")` episode: a
tool call written as the family's template writes it, its result, a reply (with thinking where the family thinks),
and in the Gym a second user turn and its reply; TRL's training template, where real/ holds one, plays the Gym
episode too. The policy emits token ids, and the replies are NOT the canonical tokenization of their text (a word
split into two tokens the tokenizer would merge), so a loop that re-tokenised text would change them. Asserted, per
turn: (1) the trained segments are the emitted ids, in order; (2) the mask is 1 exactly on them; (3) each turn's
context is the previous context followed by the ids emitted then; (4) the tool ran with the call's arguments; (5) the
first context is the template's rendering of the opening, and what textenv put after each turn is the template's text
after the token that ended it. Where a template rewrites earlier turns, the way textenv rendered around it
(`ChatRenderer.deltas_used`) is the recorded one. Templates that drop tool calls or raise on tool messages are refused
by `ChatTools` with the reason. The legacy tag syntax runs on each of the five vocabularies, and a small random-weight
model on Qwen's vocabulary samples a Gym episode with JSON tools through textenv's engine.

Vocabularies (tests/family_tokenizers.py): Qwen2.5/Qwen3, Llama 3, Mistral (tekken), GPT-OSS run on their own; the
others on a sibling's, marked ``stand-in`` in the test ids. Helpers: tests/family_episodes.py. Comparisons: all exact
(token ids, masks, texts); the scripted ids are chosen by the test, the random model's recorded from the engine's
completions.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from chat_fixtures import real_template
from family_episodes import (ANSWER, OPENING, QUERIES, QUESTION, SCHEMAS, SECOND, SHARED_TOKENIZER, THINKING, THOUGHT,
                             RecordingCalculator, ScriptedIds, Turn, assert_template_text_between_turns, assert_the_call_ran,
                             assert_trained_as_emitted, encode, gym_episode, recording, scripted_turns, split_a_word,
                             stop_ids, text_environment_episode, tiny_model, tokenizer_for)
from family_tokenizers import family_of, family_tokenizer, vocabulary_of
from textenv.chat.renderer import ChatRenderer
from textenv.chat.tool_chat import ChatTools
from textenv.chat.transcript import Transcript
from textenv.engine.engine import FINISH_EOS, FINISH_STOP, Completion
from textenv.environment import TextEnvironment
from textenv.gym import GymScheduler

# The released templates textenv runs JSON tool calls with, and the training template TRL ships for each (if any).
RUNS = {"qwen2_5": "qwen2_5_training", "qwen3": "qwen3_training", "qwen3_5_think": "qwen3_5_think_training",
        "qwen3_5_nothink": "qwen3_5_nothink_training", "nemotron_3_nano": "nemotron_3_nano_training", "llama3_1": None,
        "llama3_2": None, "gemma4": None, "gemma4_v5": None, "gptoss": "gptoss_training", "mistral_v13_tekken": None,
        "mistral_v7_tekken": None, "glm4moe": "glm4moe_training", "lfm2_v2": "lfm2_v2_training", "lfm2_2_5": None}
# How textenv's renderer gave the Gym episode's pieces (`ChatRenderer.deltas_used`' names) where the template rewrites
# earlier turns: the user message after a reply whose thinking (or empty think block, or GPT-OSS's <|return|>) the
# template renders differently once a message follows comes "after the reply" (the text after the reply's closing,
# the reply rendered with a stand-in content). Every other template renders the episode append-only.
AFTER_THE_REPLY = {"append", "after the reply"}
REWRITES = {name: AFTER_THE_REPLY for name in ("qwen3", "qwen3_5_think", "qwen3_5_nothink", "nemotron_3_nano", "gptoss", "glm4moe",
                                               "lfm2_2_5")}
# Mistral v7 moves the tool list to the last user message: the second question (and the tool list before it) is the
# text after the reply's closing.
REWRITES["mistral_v7_tekken"] = AFTER_THE_REPLY
# TRL's training templates keep the thinking of earlier turns, except these: Nemotron's still truncates it, GLM's
# still empties it, and GPT-OSS's (generation markers only) still turns the final <|return|> into <|end|>.
TRAINING_REWRITES = {name: AFTER_THE_REPLY for name in ("nemotron_3_nano", "gptoss", "glm4moe")}
# Released templates ChatTools refuses, and what the refusal names: five ignore tools= (DeepSeek's, Gemma 3's, the
# Phis'), the first LFM2 template drops the call.
REFUSED = {"deepseek_r1_distill": "ignores tools=", "deepseekv3": "ignores tools=", "gemma3": "ignores tools=",
           "phi3_5": "ignores tools=", "phi4_mini": "ignores tools=",
           "lfm2": "drops an assistant message's tool_calls"}


def template_id(template: str) -> str:
    return template if vocabulary_of(template)[1] else f"{template}-stand-in-{vocabulary_of(template)[0]}"


@pytest.fixture(autouse=True)
def fresh_queries():
    QUERIES.clear()


# ---------------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("template", list(RUNS), ids=template_id)
def test_the_scripts_hold_the_familys_call_and_ids_a_retokenising_loop_would_change(template):
    tokenizer, chat_template = tokenizer_for(template), real_template(template)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chat = ChatTools(tokenizer, chat_template=chat_template, stop_token_ids=stop_ids(template))
    assert chat.certificate.works and chat.certificate.family is family_of(template)
    assert any("not append-only" in str(warning.message) for warning in caught) == (template in REWRITES)
    turns = scripted_turns(template, chat_template, gym=True)
    (call,) = chat.parse(tokenizer.decode(turns[0].ids[:-1], skip_special_tokens=False)).calls
    assert (call.name, call.arguments) == ("Calculator", {"query": "17*23"})
    for turn in turns[1:]:
        text = tokenizer.decode(turn.ids, skip_special_tokens=False)
        assert not turn.canonical and encode(tokenizer, text) != turn.ids and "hundred" in text
    if template in THINKING:
        reply = tokenizer.decode(turns[1].ids, skip_special_tokens=False)
        assert THOUGHT in reply and family_of(template).thinking[1] in reply


@pytest.mark.parametrize("template", list(RUNS), ids=template_id)
def test_a_gym_episode_trains_exactly_what_the_policy_emitted(template):
    chat_template = real_template(template)
    script, episode, renderer = gym_episode(template, chat_template, scripted_turns(template, chat_template, gym=True))
    assert_trained_as_emitted(script, episode.history)
    assert_the_call_ran(episode.messages)
    assert [message["role"] for message in episode.messages] == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert set(renderer.deltas_used) == REWRITES.get(template, {"append"})
    assert family_of(template).rewrites_history or template not in REWRITES
    assert_template_text_between_turns(script, episode.messages, renderer.tokenizer, chat_template)


@pytest.mark.parametrize("template", list(RUNS), ids=template_id)
def test_a_text_environment_episode_trains_exactly_what_the_policy_emitted(template):
    chat_template = real_template(template)
    script, (queries, responses, masks, rewards, histories), renderer = text_environment_episode(
        template, chat_template, scripted_turns(template, chat_template, gym=False))
    history = histories[0]
    assert_trained_as_emitted(script, history)
    assert torch.equal(torch.cat([queries[0], responses[0]]), history.tokens)
    assert torch.equal(masks[0], history.token_masks[len(queries[0]) :])
    assert_the_call_ran(history.info["messages"])
    assert history.info["tool_calls"][0]["arguments"] == {"query": "17*23"} and history.info["tool_errors"] == 0
    assert_template_text_between_turns(script, history.info["messages"], renderer.tokenizer, chat_template)


@pytest.mark.parametrize("template", [name for name, training in RUNS.items() if training], ids=template_id)
def test_trls_training_template_trains_what_was_emitted_and_needs_no_stand_in_where_it_keeps_thinking(template):
    training = real_template(RUNS[template])
    script, episode, renderer = gym_episode(template, training, scripted_turns(template, training, gym=True))
    assert_trained_as_emitted(script, episode.history)
    assert_the_call_ran(episode.messages)
    assert set(renderer.deltas_used) == TRAINING_REWRITES.get(template, {"append"})
    assert_template_text_between_turns(script, episode.messages, renderer.tokenizer, training)


@pytest.mark.parametrize("template", list(REFUSED), ids=template_id)
def test_a_template_that_drops_or_refuses_tool_messages_is_refused_with_the_reason(template):
    with pytest.raises(ValueError, match="cannot train with JSON tool calls") as refused:
        if template in SHARED_TOKENIZER:  # refused on the round trip of a sample call, whoever passes the template
            ChatTools(tokenizer_for(template), chat_template=real_template(template), stop_token_ids=stop_ids(template))
        else:  # refused for ignoring tools=: the tokenizer's own template
            ChatTools(family_tokenizer(template))
    assert REFUSED[template] in str(refused.value)


# ---------------------------------------------------------------------------------------------- bugs these found
@pytest.mark.parametrize("template, stop, after", [("glm4moe", "<|observation|>", "\n<tool_response>\n391"),
                                                   ("gemma4_v5", "<|tool_response>", "response:Calculator{")],
                         ids=["glm4moe-stand-in-qwen", "gemma4_v5-stand-in-gemma3"])
def test_the_token_a_call_turn_ends_with_is_followed_by_the_template_text_after_it(template, stop, after):
    """GLM-4.5 ends a call turn at <|observation|>, the token its template opens the tool result with: textenv wrote it
    a second time. Gemma 4 ends it at <|tool_response>, which its template writes right after the call: textenv
    followed it with the closing of a plain reply (<turn|>, less the eos: a newline)."""
    tokenizer, chat_template = tokenizer_for(template), real_template(template)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GLM's template is not append-only: said so
        chat = ChatTools(tokenizer, chat_template=chat_template, stop_token_ids=stop_ids(template))
    transcript = Transcript(chat.renderer_for(SCHEMAS), OPENING, tool_parser=chat.parse)
    _, prompt = transcript.generation_context()
    ids = torch.tensor(scripted_turns(template, chat_template, gym=False)[0].ids)
    call = transcript.add_reply(Completion(ids, tokenizer.decode(ids, skip_special_tokens=False), FINISH_EOS), prompt)
    transcript.add_messages([{"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "name": "Calculator", "content": "391"}])
    text = tokenizer.decode(transcript.generation_context()[0], skip_special_tokens=False)
    assert text.count(stop) == 1 and stop + after in text


def test_gpt_oss_control_tokens_of_its_real_vocabulary_are_the_renderers():
    """GPT-OSS's released tokenizer marks <|end|> special without listing it in `all_special_tokens`: textenv could not
    render a user turn after a final answer (whose <|return|> the template turns into <|end|>), and left <|end|> in a
    tool result as the control token."""
    tokenizer = family_tokenizer("gptoss")
    renderer = ChatRenderer(tokenizer, tools=SCHEMAS)
    assert "<|end|>" not in tokenizer.all_special_tokens and "<|end|>" in renderer.special_tokens
    before = [*OPENING, {"role": "assistant", "content": ANSWER}]
    assert renderer.added_text(before, [{"role": "user", "content": SECOND}]) == f"<|start|>user<|message|>{SECOND}<|end|>"
    assert renderer.neutralize("391<|end|><|start|>assistant") == "391&lt;|end|&gt;&lt;|start|&gt;assistant"


# ---------------------------------------------------------------------------------------------- the legacy tag syntax
TAG_VOCABULARIES = {"qwen": "qwen2_5", "llama3": "llama3_1", "gemma3": "gemma4_v5", "mistral_tekken": "mistral_v13_tekken",
                    "gpt_oss": "gptoss"}  # each vocabulary through a family tokenizer built on it


@pytest.mark.parametrize("vocabulary", list(TAG_VOCABULARIES))
def test_the_legacy_tag_syntax_trains_exactly_what_the_policy_emitted_on_each_vocabulary(vocabulary):
    tokenizer = family_tokenizer(TAG_VOCABULARIES[vocabulary])
    call = Turn(encode(tokenizer, "<request><Calculator>17*23<call>"), True)
    answer = Turn(split_a_word(tokenizer, encode(tokenizer, " It is three hundred ninety-one.<submit>")), False)
    script = ScriptedIds(tokenizer, [call, answer], finish_reason=FINISH_STOP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Llama 3 has no pad token: the environment sets eos, with a warning
        env = TextEnvironment(tiny_model(), tokenizer, {"Calculator": RecordingCalculator()}, lambda texts: [0.0] * len(texts),
                              "Use the calculator.\n")

    async def generate(context_ids, stop_strings=(), generation_kwargs=None, *, episode=None):
        return script.next(context_ids)

    env._engine.generate = generate
    queries, responses, masks, rewards, histories = env.run([QUESTION])
    history = histories[0]
    assert env.tool_format == "tags" and encode(tokenizer, tokenizer.decode(answer.ids)) != answer.ids
    assert_trained_as_emitted(script, history)
    assert torch.equal(masks[0], history.token_masks[len(queries[0]) :])
    assert QUERIES == ["17*23"]
    assert history.text[history.text_spans[2][0] : history.text_spans[2][1]] == "391<response>"


# ---------------------------------------------------------------------------------------------- a sampling model
def test_a_random_model_on_qwens_vocabulary_samples_an_episode_that_is_trained_as_sampled():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = family_tokenizer("qwen2_5")
    torch.manual_seed(7)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    scheduler = GymScheduler(model, tokenizer, gym_env="family_drift_follow_up", max_turns=3, loss_scale="all",
                             generation_kwargs={"do_sample": True, "top_k": 0, "max_new_tokens": 12})
    played = recording(scheduler.engine)
    (episode,) = scheduler.run([{"query": QUESTION}])
    assert episode.errors == [] and len(played.emitted) == 3 and all(played.emitted)
    assert_trained_as_emitted(played, episode.history)
    assert any(encode(tokenizer, tokenizer.decode(ids, skip_special_tokens=False)) != ids for ids in played.emitted)
    assert "<tools>" in tokenizer.decode(played.contexts[0]) and scheduler.decoding_path.fast
