"""The `gym` benchmark workload: multi-turn chat episodes from a scripted env, three ways, on the main venv.

    python benchmarks/gym_side.py --mode scheduler|naive|transformers-cb|text-env --episodes 32 --turns 6
    python benchmarks/gym_side.py --mode client-loop --vllm-url URL --episodes 32 --turns 6

- `scheduler`: `GymScheduler` (the one episode driver on the generation engine).
- `naive`: what a user writes without textenv: every turn, re-render each unfinished episode's chat with
  the template, and call transformers' `generate` on the whole unfinished batch (left-padded).
- `transformers-cb`: the same loop with transformers' continuous batching (`model.generate_batch`, its manager
  kept across turns) instead of `generate`.
- `text-env`: `TextEnvironment` on episodes of the same shape (same model, turns and token budget; a tool
  answers every turn), for the tokens/s comparison of the two front ends.

`--vllm-url URL` runs `scheduler` or `text-env` on the vLLM server at URL (`engine=VLLMEngine`, see
`vllm_bench.py`: weights sent and a warm-up before timing, the timed run on a fresh prefix cache).

- `client-loop` (needs `--vllm-url`): what a user writes without textenv on a vLLM server: a
  `ThreadPoolExecutor` with one worker per episode, each POSTing its messages to `/v1/chat/completions` turn
  after turn (`urllib.request`, the same questions, follow-ups, system prompt, token budget and greedy
  decoding), appending the reply's text and the next follow-up. No model is loaded; a warm-up request before
  timing and the timed run on a fresh prefix cache, as for textenv's sides. The replies' token ids come from
  vLLM's `return_token_ids` (compared with textenv's).

The env asks a question from a fixed list and answers every reply with a short follow-up; an episode runs
all `--turns` turns. Prints one `BENCH_RESULT {json}` line: seconds, generated tokens, tokens/s and every
reply's token ids (to check that the ways generate the same tokens).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from functools import partial

import torch

import vllm_bench
import workload
from textenv.engine.fast_path import GENERATE
from textenv.gym.builtin import MATH_RETRY_PROMPT, MATH_SYSTEM_PROMPT

warnings.filterwarnings("ignore")

QUESTIONS = [
    "Name a fruit that is red.", "What is the capital of France?", "Give me a word that rhymes with cat.",
    "Which animal says moo?", "What colour is the sky on a clear day?", "Name a planet in our solar system.",
    "How many legs does a spider have?", "What do bees make?",
]
FOLLOW_UPS = ["Tell me one more thing about it.", "Why is that?", "Say it in other words.", "Can you give an example?", "Thanks. Anything else?"]
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
DEFAULT_MAX_NEW_TOKENS = 32
MAX_NEW_TOKENS = DEFAULT_MAX_NEW_TOKENS


SCRIPTS = {
    # A short system prompt and short follow-ups: the least context to re-encode, the worst case for textenv.
    "chat": (SYSTEM, QUESTIONS, FOLLOW_UPS),
    # ms-swift's math_env prompts (the R1 system prompt, its retry message after a wrong answer).
    "math": (MATH_SYSTEM_PROMPT, [f"What is {a} * {b}? Show your reasoning." for a, b in ((17, 23), (48, 12), (91, 7), (36, 36))], [MATH_RETRY_PROMPT]),
}
SCRIPT = "chat"
NAIVE_PATH = f"{GENERATE} (the naive loop, every turn)"
TRANSFORMERS_CB_PATH = "transformers' continuous batching (model.generate_batch, the naive loop, every turn)"
CLIENT_LOOP_PATH = "vLLM /v1/chat/completions (a plain client loop, a thread per episode)"


def system() -> str:
    return SCRIPTS[SCRIPT][0]


def question(index: int) -> str:
    questions = SCRIPTS[SCRIPT][1]
    return f"{questions[index % len(questions)]} (question {index})"


def follow_up(turn: int) -> str:
    follow_ups = SCRIPTS[SCRIPT][2]
    return follow_ups[(turn - 1) % len(follow_ups)]


def greedy_kwargs() -> dict:
    return {"do_sample": False, "max_new_tokens": MAX_NEW_TOKENS, "temperature": None, "top_p": None, "top_k": None}


def load(model_path: str, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    from textenv.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    return model, tokenizer


def run_scheduler(model, tokenizer, episodes: int, turns: int, engine="textenv") -> dict:
    from textenv.gym import Env, GymScheduler, register_env

    @register_env("bench_chat")
    class ChatEnv(Env):
        async def reset(self, config):
            self.turn = 0
            return question(config.data_dict["index"]), {}, system()

        async def step(self, action):
            self.turn += 1
            return follow_up(self.turn), 0.0, False, {}

        async def close(self):
            return None

    scheduler = GymScheduler(model, tokenizer, gym_env="bench_chat", max_turns=turns, generation_kwargs=greedy_kwargs(),
                             batch_size=episodes, max_concurrency=episodes, loss_scale="default", engine=engine)
    rows = [{"index": index} for index in range(episodes)]
    started = time.perf_counter()
    results = scheduler.run(rows)
    seconds = time.perf_counter() - started
    replies = [[segment.tolist() for segment in _model_segments(episode.history)] for episode in results]
    return _result(seconds, replies, str(scheduler.decoding_path))


def run_naive(model, tokenizer, episodes: int, turns: int, generate_turn=None, path: str = NAIVE_PATH) -> dict:
    """The loop a user writes without textenv: every turn, each unfinished episode's chat rendered with the template,
    its replies generated by `generate_turn(contexts) -> reply ids` (default: transformers' `generate` on the whole
    batch, left-padded), their text appended with the next follow-up."""
    generate_turn = generate_turn or partial(_generate_padded, model, tokenizer)
    conversations = [[{"role": "system", "content": system()}, {"role": "user", "content": question(index)}] for index in range(episodes)]
    replies: list[list[list[int]]] = [[] for _ in range(episodes)]
    started = time.perf_counter()
    for turn in range(1, turns + 1):
        contexts = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"] for chat in conversations]
        for index, ids in enumerate(generate_turn(contexts)):
            replies[index].append(ids)
            text = tokenizer.decode(ids, skip_special_tokens=True)
            conversations[index].append({"role": "assistant", "content": text})
            if turn < turns:
                conversations[index].append({"role": "user", "content": follow_up(turn)})
    return _result(time.perf_counter() - started, replies, path)


def _generate_padded(model, tokenizer, contexts: list[list[int]]) -> list[list[int]]:
    """One turn of every context with transformers' `generate` on the left-padded batch; each reply up to its EOS."""
    from textenv.padding import left_pad

    input_ids, attention_mask = (tensor.to(model.device) for tensor in left_pad([torch.tensor(ids) for ids in contexts], tokenizer.pad_token_id))
    with torch.no_grad():
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, pad_token_id=tokenizer.pad_token_id,
                                eos_token_id=tokenizer.eos_token_id, **greedy_kwargs())
    replies = []
    for row in output[:, input_ids.shape[1]:].tolist():
        ids = row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row
        replies.append([token for token in ids if token != tokenizer.pad_token_id or token == tokenizer.eos_token_id])
    return replies


def run_transformers_cb(model, tokenizer, episodes: int, turns: int) -> dict:
    """The naive loop with transformers' continuous batching instead of `generate`: every turn one
    `model.generate_batch` call on the unfinished episodes' contexts (paged attention, a scheduler admitting requests
    as others end), its manager kept from turn to turn (`persistent_manager=True`), greedy, the same token budget."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)

    def generate_turn(contexts: list[list[int]]) -> list[list[int]]:
        outputs = model.generate_batch(contexts, generation_config=config, progress_bar=False, persistent_manager=True, warmup=False)
        ordered = sorted(outputs.values(), key=lambda output: int(output.request_id.rsplit("_", 1)[1]))
        return [list(output.generated_tokens) for output in ordered]

    try:
        return run_naive(model, tokenizer, episodes, turns, generate_turn, TRANSFORMERS_CB_PATH)
    finally:
        model.destroy_cached_continuous_batching_manager()


def run_text_env(model, tokenizer, episodes: int, turns: int, engine="textenv") -> dict:
    """TextEnvironment playing the very same episodes: the prompt is the chat template's rendering of the
    system and first user message, and the legacy hooks are overridden so that every turn ends with the
    env's follow-up, rendered by the template as the Gym renders it. Same tokens in, same tokens out."""
    from textenv import TextEnvironment

    def text_after_reply(message: dict) -> str:
        """What the template puts after an assistant reply "x": its closing, `message`, the next header."""
        before = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "x"}]
        grown = tokenizer.apply_chat_template([*before, message], tokenize=False, add_generation_prompt=True)
        return grown[grown.rindex("x<|im_end|>") + 1:]

    class ScriptedChatEnvironment(TextEnvironment):
        def task_end_check(self, history, model_turn=True):
            return False, False  # every episode runs all its turns, as the Gym env's do

        def step(self, history):
            turn = sum(1 for system in history.system_spans if not system)
            observation = text_after_reply({"role": "user", "content": follow_up(turn)})
            ended_by_eos = history.tokens[-1].item() == tokenizer.eos_token_id
            text = observation[len(tokenizer.eos_token):] if ended_by_eos else observation
            tokens = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
            history.append_segment(text, tokens, system=True)
            return history

    openings = [
        tokenizer.apply_chat_template([{"role": "system", "content": system()}, {"role": "user", "content": question(index)}],
                                      tokenize=False, add_generation_prompt=True)
        for index in range(episodes)
    ]
    env = ScriptedChatEnvironment(model, tokenizer, {}, None, "", max_turns=turns, generation_kwargs=greedy_kwargs(), batch_size=episodes,
                                   engine=engine)
    started = time.perf_counter()
    *_, histories = env.run(openings)
    seconds = time.perf_counter() - started
    return _result(seconds, [[segment.tolist() for segment in _model_segments(history)] for history in histories], str(env.decoding_path))


def run_client_loop(url: str, episodes: int, turns: int) -> dict:
    """The plain client loop on the vLLM server at `url` (see the module's doc): one thread per episode, one
    `/v1/chat/completions` request per turn. Greedy (temperature 0), `max_tokens` the turn budget; vLLM ends a
    turn at the tokenizer's EOS by itself. `return_token_ids` only reports the reply's ids (for the token
    checks): it changes nothing the server does."""
    import json
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from textenv.vllm.client import VLLMServerClient

    model = VLLMServerClient(url).model  # the served model's name, read once before the episodes

    def chat(messages: list[dict]) -> dict:
        body = {"model": model, "messages": messages, "max_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "return_token_ids": True}
        request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as answer:
            return json.loads(answer.read())["choices"][0]

    def play(index: int) -> list[list[int]]:
        messages = [{"role": "system", "content": system()}, {"role": "user", "content": question(index)}]
        replies = []
        for turn in range(1, turns + 1):
            choice = chat(messages)
            replies.append(choice.get("token_ids") or [])
            messages.append({"role": "assistant", "content": choice["message"]["content"]})
            if turn < turns:
                messages.append({"role": "user", "content": follow_up(turn)})
        return replies

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=episodes) as pool:
        replies = list(pool.map(play, range(episodes)))
    return _result(time.perf_counter() - started, replies, CLIENT_LOOP_PATH + f" ({url})")


def run_vllm_loop(llm, episodes: int, turns: int) -> dict:
    """vLLM's own offline engine as a user drives it without textenv: every turn, one `LLM.chat` call on the
    unfinished episodes' conversations (the same prompts, greedy, the same token budget), then the replies'
    text appended and the next follow-up."""
    import vllm

    params = vllm.SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
    conversations = [[{"role": "system", "content": system()}, {"role": "user", "content": question(index)}] for index in range(episodes)]
    replies: list[list[list[int]]] = [[] for _ in range(episodes)]
    started = time.perf_counter()
    for turn in range(1, turns + 1):
        for index, output in enumerate(llm.chat(conversations, params, use_tqdm=False)):
            completion = output.outputs[0]
            replies[index].append(list(completion.token_ids))
            conversations[index].append({"role": "assistant", "content": completion.text})
            if turn < turns:
                conversations[index].append({"role": "user", "content": follow_up(turn)})
    return _result(time.perf_counter() - started, replies, "vllm.LLM.chat per turn (vLLM's offline engine, in this process)")


def colocated_engine(model_path: str, model, tokenizer, dtype: str):
    """A `VLLMEngine` on a `ColocatedVLLM` in this process (`vllm_mode="colocate"`), the policy's weights loaded
    and a warm-up request done before timing."""
    from textenv.vllm import VLLMEngine
    from textenv.vllm.colocate import ColocatedVLLM

    engine = VLLMEngine(model, tokenizer, [ColocatedVLLM(model_path, dtype=dtype, enforce_eager=True, max_model_len=4096)], batch_size=32)
    started = time.perf_counter()
    engine.prepare()
    engine.prepare_seconds = time.perf_counter() - started
    return engine


def _reset_prefix_cache(url: str) -> None:
    from textenv.vllm.client import VLLMServerClient

    VLLMServerClient(url).reset_prefix_cache()


def _model_segments(history) -> list[torch.Tensor]:
    if history is None:
        return []
    return [history.tokens[start:end] for (start, end), system in zip(history.token_spans, history.system_spans) if not system]


def _result(seconds: float, replies: list[list[list[int]]], path: str) -> dict:
    """One mode's measurement; `path` says what decoded its turns (the engine's loop or `generate`)."""
    tokens = sum(len(reply) for episode in replies for reply in episode)
    return {"seconds": seconds, "generated_tokens": tokens, "tokens_per_second": tokens / seconds, "decoding_path": path,
            "turns": sum(len(episode) for episode in replies), "replies": replies, "peak_rss_mb": workload.peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", required=True, choices=["scheduler", "scheduler-transformers", "naive", "transformers-cb", "text-env", "client-loop", "vllm-loop"])
    parser.add_argument("--model-path", default=None, help="default: the bundled model")
    parser.add_argument("--script", choices=sorted(SCRIPTS), default="chat", help="the env's prompts (default: chat)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="tokens per model turn (default: %(default)s)")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--threads", type=int, default=workload.NUM_THREADS)
    parser.add_argument("--device", default="cpu", help="where the model runs (default: cpu; `cuda` for GPU figures)")
    parser.add_argument("--vllm-url", default=None, help="scheduler / text-env: decode on the vLLM server at this URL; client-loop: its server")
    parser.add_argument("--colocate", choices=["float32", "bfloat16"], default=None,
                        help="scheduler / text-env: decode on vLLM colocated in this process, in this dtype; vllm-loop: its dtype")
    parser.add_argument("--vllm-pid", type=int, default=None, help="the vLLM server's process group: its CPU time over the timed run is recorded")
    args = parser.parse_args()
    if args.vllm_url and args.mode in ("naive", "transformers-cb", "scheduler-transformers"):
        parser.error("--vllm-url is for the scheduler, text-env and client-loop modes (the naive loops and scheduler-transformers call transformers)")
    if args.mode == "client-loop" and not args.vllm_url:
        parser.error("--mode client-loop needs --vllm-url (the server it sends its requests to)")
    global SCRIPT, MAX_NEW_TOKENS
    SCRIPT, MAX_NEW_TOKENS = args.script, args.max_new_tokens
    torch.set_num_threads(args.threads)
    if args.mode == "client-loop":
        run_client_loop(args.vllm_url, 2, 1)  # warm-up
        _reset_prefix_cache(args.vllm_url)
        workload.emit(_timed_on_server(lambda: run_client_loop(args.vllm_url, args.episodes, args.turns), args.vllm_pid))
        return
    if args.model_path is None:
        from textenv.models import bundled_model_path

        args.model_path = str(bundled_model_path())
    if args.mode == "vllm-loop":
        import vllm

        llm = vllm.LLM(model=args.model_path, dtype=args.colocate or "float32", enforce_eager=True, max_model_len=4096)
        run_vllm_loop(llm, 2, 1)  # warm-up
        llm.reset_prefix_cache()
        workload.emit(run_vllm_loop(llm, args.episodes, args.turns))
        return
    model, tokenizer = load(args.model_path, args.device)
    if args.colocate:
        engine = colocated_engine(args.model_path, model, tokenizer, args.colocate)
        runner = {"scheduler": partial(run_scheduler, engine=engine), "text-env": partial(run_text_env, engine=engine)}[args.mode]
        runner(model, tokenizer, 2, 1)  # warm-up
        vllm_bench.fresh_cache(engine)
        workload.emit({**_timed_on_server(lambda: runner(model, tokenizer, args.episodes, args.turns), None), **vllm_bench.engine_record(engine)})
        return
    with vllm_bench.prepared_engine(args.vllm_url, model, tokenizer) if args.vllm_url else contextlib.nullcontext("textenv") as engine:
        runner = {"scheduler": partial(run_scheduler, engine=engine), "naive": run_naive, "transformers-cb": run_transformers_cb,
                  "scheduler-transformers": partial(run_scheduler, engine="transformers"),
                  "text-env": partial(run_text_env, engine=engine)}[args.mode]
        runner(model, tokenizer, 2, 1)  # warm-up
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        if not args.vllm_url:
            workload.emit(runner(model, tokenizer, args.episodes, args.turns))
            return
        vllm_bench.fresh_cache(engine)
        result = _timed_on_server(lambda: runner(model, tokenizer, args.episodes, args.turns), args.vllm_pid)
        workload.emit({**result, **vllm_bench.engine_record(engine)})


def _timed_on_server(run, server_pid: int | None) -> dict:
    """`run()`'s result with this process's CPU seconds over it (`client_seconds_cpu`) and, given the server's
    process group, the server's (`server_seconds_cpu`): where a run on vLLM spends its CPU."""
    before_server = vllm_bench.server_usage(server_pid)[0] if server_pid else None
    before = time.process_time()
    result = run()
    result["client_seconds_cpu"] = time.process_time() - before
    if before_server is not None:
        result["server_seconds_cpu"] = vllm_bench.server_usage(server_pid)[0] - before_server
    return result


if __name__ == "__main__":
    main()
