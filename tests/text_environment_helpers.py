"""Shared by the TextEnvironment test modules (tests/test_text_environment_*.py): the prompt, a tool that echoes,
a reward by episode index, an environment of them, and a scripted policy."""

import torch

from textenv import TextEnvironment

PROMPT = "I am a prompt!\n"


class DummyTool:
    def __call__(self, text):
        return text


def reward_by_index(texts, **kwargs):
    return [torch.tensor(index) for index, _ in enumerate(texts)]


def make_env(model, tokenizer, tools=None, **kwargs):
    tools = {"DummyTool": DummyTool()} if tools is None else tools
    return TextEnvironment(model, tokenizer, tools, kwargs.pop("reward_fn", reward_by_index), PROMPT, **kwargs)


def scripted_generate(segment="<request><DummyTool>test<call>", tokens=(101, 102, 103)):
    """A policy that always writes the same segment (the legacy tests' mock of `generate`)."""

    def generate(histories):
        for history in histories:
            if not history.completed:
                history.append_segment(segment, torch.tensor(tokens), system=False)
        return histories

    return generate
