"""The host cost of a multi-turn JSON tool-call episode, per template: what textenv does between model turns.

    python benchmarks/transcript_bench.py                      # every template below, 4, 8 and 16 model turns
    python benchmarks/transcript_bench.py --templates qwen3 gptoss --turns 24 --repeats 9

An episode is played on a `Transcript` (the Gym's and `TextEnvironment(tool_format="json")`'s record of a
conversation) by scripted replies, with no model: every odd turn a tool call as the template writes it, answered by a
tool result; every even turn a plain reply, answered by a follow-up question. Per turn: the generation context, the
reply (read by the family's parser) and the next messages. The templates are the real ones of
``tests/fixtures/chat_templates/real/`` on their family's real vocabulary (``tests/fixtures/tokenizers/``, a sibling
stand-in where the family's own is not vendored).

Three ways, alternated within each repeat, medians printed side by side with the ratio of the first two:

- ``textenv``: textenv as it is: `ChatRenderer.reply_continuation` renders the reply as the model wrote it (two
  renders), so the template's text after it is exact (Gemma 4's after a call, GLM's doubled stop token), and the
  renderer keeps its last renders (`RENDER_CACHE_SIZE`), which a turn asks for more than once;
- ``before``: what textenv did before both (5a0329e^): no `reply_continuation` (the closing is the template's
  `assistant_suffix`, one render; wrong on Gemma 4 and GLM) and no render cache: the cost reference;
- ``no continuation``: the render cache without `reply_continuation`: what the continuation itself costs.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
warnings.filterwarnings("ignore")

from chat_fixtures import real_template  # noqa: E402
from family_episodes import CALL, JSON_ARGUMENTS, OPENING, SCHEMAS, STOPS, stop_ids, tokenizer_for, written_by_template  # noqa: E402
from family_tokenizers import family_of, vocabulary_of  # noqa: E402
from textenv.chat import renderer as renderer_module  # noqa: E402
from textenv.chat.renderer import RENDER_CACHE_SIZE, with_json_arguments  # noqa: E402
from textenv.chat.tool_chat import ChatTools  # noqa: E402
from textenv.chat.transcript import Transcript  # noqa: E402
from textenv.engine.engine import FINISH_EOS, Completion  # noqa: E402

TEMPLATES = ("qwen2_5", "qwen3", "llama3_1", "mistral_v13_tekken", "gptoss", "gemma4_v5", "glm4moe", "lfm2_v2")
EPISODES = itertools.count()
REPLY = {"role": "assistant", "content": "It is three hundred ninety-one, as the calculator said."}


def scripted_ids(template: str, message: dict, stop: str) -> torch.Tensor:
    """The ids of `message` as the template writes it after the generation prompt, ended by the model's stop token."""
    tokenizer, chat_template = tokenizer_for(template), real_template(template)
    text = written_by_template(tokenizer, chat_template, message).rstrip("\n")
    text = text[: -len(stop)] if text.endswith(stop) else text
    return torch.tensor(tokenizer(text + stop, add_special_tokens=False).input_ids)


def play(chat: ChatTools, template: str, turns: int, replies: tuple) -> float:
    """Seconds to play one `turns`-turn episode on a fresh transcript (with a question of its own: nothing of an
    earlier episode's renders is reused)."""
    tokenizer = tokenizer_for(template)
    opening = [*OPENING[:-1], {"role": "user", "content": f"{OPENING[-1]['content']} (episode {next(EPISODES)})"}]
    started = time.perf_counter()
    transcript = Transcript(chat.renderer_for(SCHEMAS), opening, tool_parser=chat.parser_for(SCHEMAS))
    for turn in range(turns):
        _, prompt = transcript.generation_context()
        ids = replies[turn % 2]
        message = transcript.add_reply(Completion(ids, tokenizer.decode(ids, skip_special_tokens=False), FINISH_EOS), prompt)
        if message.get("tool_calls"):
            transcript.add_messages([{"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "name": "Calculator", "content": "391"}])
        else:
            transcript.add_messages([{"role": "user", "content": f"And what is {turn} more?"}])
    return time.perf_counter() - started


WAYS = {"textenv": (True, RENDER_CACHE_SIZE), "before": (False, 0), "no continuation": (False, RENDER_CACHE_SIZE)}


def measure(template: str, turns: int, repeats: int) -> dict:
    """Median milliseconds per episode of each of `WAYS`."""
    chat = ChatTools(tokenizer_for(template), chat_template=real_template(template), stop_token_ids=stop_ids(template))
    call_stop, reply_stop = STOPS[family_of(template).name]
    call = with_json_arguments([CALL])[0] if template in JSON_ARGUMENTS else CALL
    replies = (scripted_ids(template, call, call_stop), scripted_ids(template, REPLY, reply_stop))
    renderer = chat.renderer_for(SCHEMAS)
    times = {way: [] for way in WAYS}
    play(chat, template, 2, replies)  # warm the template cache
    for repeat in range(repeats):
        for way in (list(WAYS) if repeat % 2 == 0 else list(WAYS)[::-1]):
            continuation, renderer_module.RENDER_CACHE_SIZE = WAYS[way]
            if not continuation:
                renderer.reply_continuation = lambda *args: None
            times[way].append(play(chat, template, turns, replies))
            renderer.__dict__.pop("reply_continuation", None)
    renderer_module.RENDER_CACHE_SIZE = RENDER_CACHE_SIZE
    return {way: statistics.median(values) * 1000 for way, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--templates", nargs="+", default=list(TEMPLATES))
    parser.add_argument("--turns", nargs="+", type=int, default=[4, 8, 16])
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()
    print(f"{'template':<20} {'vocabulary':<19} {'turns':>5} {'textenv ms':>11} {'before ms':>10} {'ratio':>6} {'no continuation ms':>19}")
    for template in arguments.templates:
        name, own = vocabulary_of(template)
        for turns in arguments.turns:
            result = measure(template, turns, arguments.repeats)
            ratio = result["textenv"] / result["before"]
            print(f"{template:<20} {name + ('' if own else ' (stand-in)'):<19} {turns:>5} {result['textenv']:>11.1f} "
                  f"{result['before']:>10.1f} {ratio:>6.2f} {result['no continuation']:>19.1f}", flush=True)

if __name__ == "__main__":
    main()
