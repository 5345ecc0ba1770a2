"""TextHistory: the legacy test vectors (tokens given by hand) and the rendering.

Comparisons: all exact (integer token ids, masks, spans, texts; a reward of 0.75 printed).
"""

import io

import pytest
import torch
from rich.console import Console

from textenv import TextHistory


def test_init_system_and_model_masks():
    history = TextHistory("Hello there!", torch.tensor([1, 2, 3]))
    assert history.text == "Hello there!"
    assert history.tokens.tolist() == [1, 2, 3]
    assert history.token_masks.tolist() == [0, 0, 0]
    model_history = TextHistory("Hello there!", torch.tensor([1, 2, 3]), system=False)
    assert model_history.token_masks.tolist() == [1, 1, 1]


def test_append_segment_concatenates_text_tokens_and_masks():
    history = TextHistory("Hello there!", torch.tensor([1, 2, 3]))
    history.append_segment("General Kenobi!", torch.tensor([4, 5, 6]), system=False)
    assert history.text == "Hello there!General Kenobi!"
    assert history.tokens.tolist() == [1, 2, 3, 4, 5, 6]
    assert history.token_masks.tolist() == [0, 0, 0, 1, 1, 1]
    history.append_segment("You are a bold one!", torch.tensor([7, 8, 9]))
    assert history.tokens.tolist() == list(range(1, 10))
    assert history.token_masks.tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0]
    assert history.text_spans == [(0, 12), (12, 27), (27, 46)]
    assert history.token_spans == [(0, 3), (3, 6), (6, 9)]
    assert history.system_spans == [True, False, True]


@pytest.mark.parametrize("text, tokens", [("", [1]), ("x", [])])
def test_append_empty_segment_raises(text, tokens):
    history = TextHistory("Hello", torch.tensor([1]))
    with pytest.raises(ValueError, match="Can't append empty text or token list to history."):
        history.append_segment(text, torch.tensor(tokens, dtype=torch.long))


def test_complete_and_truncated():
    history = TextHistory("Hello there!", torch.tensor([1, 2, 3]))
    assert not history.completed and not history.truncated
    history.complete()
    assert history.completed and not history.truncated
    history.complete(truncated=True)
    assert history.completed and history.truncated


def test_last_text_segment():
    history = TextHistory("Hello there!", torch.tensor([1, 2, 3]))
    history.append_segment("General Kenobi!", torch.tensor([4, 5, 6]), system=False)
    history.append_segment("You are a bold one!", torch.tensor([7, 8, 9]))
    assert history.last_text_segment == "You are a bold one!"
    assert history.last_model_segment == "General Kenobi!"


def test_split_query_response():
    history = TextHistory("Hello there!", torch.tensor([1, 2, 3]))
    history.append_segment("General Kenobi!", torch.tensor([4, 5, 6]), system=False)
    history.append_segment("You are a bold one!", torch.tensor([7, 8, 9]), system=True)
    query, response, mask = history.split_query_response_tokens()
    assert query.tolist() == [1, 2, 3]
    assert response.tolist() == [4, 5, 6, 7, 8, 9]
    assert mask.tolist() == [1, 1, 1, 0, 0, 0]


def test_tokens_must_be_one_dimensional():
    with pytest.raises(ValueError, match="1-D"):
        TextHistory("Hello", torch.ones(2, 2, dtype=torch.long))


def _recording_console():
    return Console(record=True, file=io.StringIO(), width=200, color_system="truecolor", force_terminal=True)


def _sample_history():
    history = TextHistory("Prompt: 2+2?", torch.tensor([10, 11, 12]))
    history.append_segment("<request><Calc>2+2<call>", torch.tensor([13, 14]), system=False)
    history.append_segment("4<response>", torch.tensor([15]), system=True)
    history.reward = 0.75
    return history


def test_show_text_renders_segments_colours_and_reward():
    console = _recording_console()
    _sample_history().show_text(show_legend=True, console=console)
    plain = console.export_text(clear=False)
    assert "Prompt: 2+2?<request><Calc>2+2<call>4<response>" in plain
    assert "Reward: 0.75" in plain
    assert "(Colour Legend: Prompt|System|Model|Reward)" in plain
    html = console.export_html(inline_styles=True)
    # deep_sky_blue1 (model) is #00afff, cyan3 (system) is #00d7af, grey85 (prompt) #dadada, plum1 #ffafff.
    for colour in ("#00afff", "#00d7af", "#dadada", "#ffafff"):
        assert colour in html.lower()


def test_show_text_goes_to_stdout_by_default(capsys):
    _sample_history().show_text()
    out = capsys.readouterr().out
    assert "<request><Calc>2+2<call>" in out and "Reward: 0.75" in out


def test_show_tokens_spells_every_token(tokenizer):
    text = "What is 2+2?"
    tokens = tokenizer(text, return_tensors="pt").input_ids[0]
    history = TextHistory(text, tokens)
    answer = tokenizer("<submit>", add_special_tokens=False, return_tensors="pt").input_ids[0]
    history.append_segment("<submit>", answer, system=False)
    history.reward = 1.0
    console = _recording_console()
    history.show_tokens(tokenizer, console=console)
    plain = console.export_text()
    spelled = " ".join(tokenizer.convert_ids_to_tokens(history.tokens.tolist()))
    assert spelled in plain
    assert "Reward: 1.0" in plain


def test_repr_html_is_coloured_html():
    html = _sample_history()._repr_html_()
    assert "<request><Calc>2+2<call>" in html.replace("&lt;", "<").replace("&gt;", ">")
    assert "#00afff" in html.lower()
