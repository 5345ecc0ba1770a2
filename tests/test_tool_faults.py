"""Tools that raise, hang, or return huge or non-string values never end a TextEnvironment batch, and
leave no threads, processes or file handles behind."""

import gc
import random
import threading
import time

import psutil
import torch

from textenv import TextEnvironment
from textenv.tools.base import TOOL_ERROR_PREFIX


class Unprintable:
    def __str__(self):
        raise RuntimeError("no str for you")


def raising_tool(query):
    raise KeyError(query)


def hanging_tool(query):
    time.sleep(0.6)  # longer than the environment's tool_timeout
    return "too late"


def huge_tool(query):
    return "x" * 5_000_000


FAULTY_TOOLS = {
    "ok": lambda q: f"ok {q}",
    "raise": raising_tool,
    "hang": hanging_tool,
    "huge": huge_tool,
    "bytes": lambda q: b"\x00\xff",
    "dict": lambda q: {"answer": 1},
    "unprintable": lambda q: Unprintable(),
}

EXPECTED_RESPONSE = {
    "ok": lambda q: f"ok {q}",
    "raise": lambda q: f"{TOOL_ERROR_PREFIX}'{q}'",
    "hang": lambda q: f"{TOOL_ERROR_PREFIX}timed out after 0.1 s",
    "huge": lambda q: "x" * 97 + "...",
    "bytes": lambda q: "b'\\x00\\xff'",
    "dict": lambda q: "{'answer': 1}",
    "unprintable": lambda q: f"{TOOL_ERROR_PREFIX}the tool returned a Unprintable that cannot be shown: no str for you",
}


def random_tool_policy(seed):
    rng = random.Random(seed)

    def generate(histories):
        for history in histories:
            if not history.completed:
                name = rng.choice(list(FAULTY_TOOLS))
                history.append_segment(f"<request><{name}>q{rng.randrange(10)}<call>", torch.tensor([101, 102]), system=False)
        return histories

    return generate


def _resources():
    process = psutil.Process()
    return threading.active_count(), len(process.children(recursive=True)), process.num_fds()


def test_faulty_tools_never_end_the_batch_and_leak_nothing(tiny_model, tokenizer):
    env = TextEnvironment(tiny_model, tokenizer, FAULTY_TOOLS, lambda texts: [0.0] * len(texts), "p:", max_turns=3, tool_timeout=0.1)
    env.generate = random_tool_policy(seed=0)
    env.run(["warm-up"])
    time.sleep(0.7)  # let the warm-up's timed-out tool threads finish
    gc.collect()
    threads_before, children_before, fds_before = _resources()
    rss_before = psutil.Process().memory_info().rss

    seen_tools = set()
    for round_index in range(5):
        env.generate = random_tool_policy(seed=round_index)
        *_, histories = env.run([f"task {i}" for i in range(12)])
        assert len(histories) == 12
        for history in histories:
            assert history.completed and history.truncated  # max_turns ended every episode
            model_texts = [history.text[s:e] for (s, e), sys in zip(history.text_spans, history.system_spans) if not sys]
            tool_texts = [history.text[s:e] for (s, e), sys in zip(history.text_spans, history.system_spans) if sys][1:]
            assert len(model_texts) == len(tool_texts) == 3
            for call, response in zip(model_texts, tool_texts):
                name, query = env.parse_tool_call(call)
                seen_tools.add(name)
                assert response == EXPECTED_RESPONSE[name](query) + "<response>"
    assert seen_tools == set(FAULTY_TOOLS)

    time.sleep(0.7)  # timed-out threads of the last round finish their sleep
    gc.collect()
    threads_after, children_after, fds_after = _resources()
    assert threads_after <= threads_before
    assert children_after == children_before
    assert fds_after <= fds_before
    # 60 episodes of 5 MB tool outputs must not accumulate: allow 50 MB of allocator noise.
    assert psutil.Process().memory_info().rss - rss_before < 50_000_000


def test_unknown_tool_and_malformed_calls_are_answered_not_raised(tiny_model, tokenizer):
    env = TextEnvironment(tiny_model, tokenizer, {"ok": FAULTY_TOOLS["ok"]}, None, "p:", max_turns=1)

    def generate(histories):
        calls = ["<request><missing>1<call>", "<call><request>", "<request>no tool tag<call>"]
        for history, call in zip(histories, calls):
            history.append_segment(call, torch.tensor([101]), system=False)
        return histories

    env.generate = generate
    *_, histories = env.run(["a", "b", "c"])
    assert histories[0].last_text_segment == "Unknown tool missing.<response>"
    # Both tags present but no parsable call: the model is told (its echoed tags defused) and may retry.
    assert histories[1].last_text_segment == "Unknown tool call: &lt;call&gt;&lt;request&gt;<response>"
    assert histories[2].last_text_segment == "Unknown tool call: &lt;request&gt;no tool tag&lt;call&gt;<response>"
