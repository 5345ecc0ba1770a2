"""GrowingLayer: appending in place gives the same keys/values as transformers' concatenating DynamicLayer.

Tolerances (tests/numerics.py has the analysis):
- exact: keys and values stored, selected, cropped and merged (copies of the same numbers);
- `assert_reordered_close` with `logit_terms`: the logits of a model decoding with either cache. The two caches
  hold the same keys and values, but the growing one hands attention views into a larger buffer (other strides),
  and the attention kernel may sum in another order for them.
"""

import torch
from transformers.cache_utils import DynamicLayer

from textenv.engine.kv_cache import GrowingLayer, growing_cache
from textenv.engine.fast_path import decoding_path
from textenv.testing import tiny_causal_lm

from numerics import assert_reordered_close, logit_terms


def chunks(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(3, 2, n, 4, generator=generator), torch.randn(3, 2, n, 4, generator=generator)) for n in lengths]


def test_appends_equal_concatenation_across_reallocations():
    growing, dynamic = GrowingLayer(spare=2), DynamicLayer()
    buffers = set()
    for keys, values in chunks([5, 1, 1, 1, 4, 1]):
        got = growing.update(keys, values)
        expected = dynamic.update(keys, values)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)
        buffers.add(growing.keys.untyped_storage().data_ptr())
    assert growing.get_seq_length() == dynamic.get_seq_length() == 13
    assert len(buffers) == 3  # room for 7 after the first 5; 10 when the 8th arrives; 14 when 12 are needed


def test_batch_select_then_append():
    growing, dynamic = GrowingLayer(spare=4), DynamicLayer()
    (keys, values), (more_keys, more_values) = chunks([6, 1])
    growing.update(keys, values)
    dynamic.update(keys, values)
    index = torch.tensor([2, 0])
    growing.batch_select_indices(index)
    dynamic.batch_select_indices(index)
    got = growing.update(more_keys[index], more_values[index])
    expected = dynamic.update(more_keys[index], more_values[index])
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)


def test_crop_and_reset():
    growing = GrowingLayer(spare=4)
    (keys, values), = chunks([6])
    growing.update(keys, values)
    growing.crop(-2)
    assert growing.get_seq_length() == 4
    torch.testing.assert_close(growing.keys, keys[:, :, :4], rtol=0, atol=0)
    (more_keys, more_values), = chunks([1], seed=1)
    growing.update(more_keys, more_values)
    torch.testing.assert_close(growing.keys, torch.cat([keys[:, :, :4], more_keys], dim=2), rtol=0, atol=0)
    growing.reset()
    assert growing.get_seq_length() == 0


def test_model_forward_with_growing_cache_equals_dynamic_cache():
    from transformers import DynamicCache

    model = tiny_causal_lm()
    cache_argument = decoding_path(model).cache_argument
    ids = torch.randint(3, 1000, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = {}
    for name, cache in (("growing", growing_cache(model.config, spare=3)), ("dynamic", DynamicCache(config=model.config))):
        with torch.no_grad():
            steps = [model(input_ids=ids[:, :5], use_cache=True, **{cache_argument: cache}).logits[:, -1]]
            for position in range(5, 9):
                steps.append(model(input_ids=ids[:, position : position + 1], use_cache=True, **{cache_argument: cache}).logits[:, -1])
        logits[name] = torch.stack(steps)
    assert all(isinstance(layer, GrowingLayer) for layer in growing_cache(model.config, spare=3).layers)
    assert_reordered_close(logits["growing"], logits["dynamic"], logit_terms(model.config, ids.shape[1]), "logits with a growing cache")


def test_merged_cache_right_aligns_rows_and_empties_the_sources():
    from textenv.engine.kv_cache import merged_cache

    config = tiny_causal_lm().config
    sources = []
    for rows, length, seed in ((2, 5, 0), (3, 3, 1)):
        cache = growing_cache(config, spare=2)
        for index in range(len(cache.layers)):
            (keys, values), = chunks([length], seed=seed + index)
            cache.layers[index].update(keys[:rows], values[:rows])
        sources.append(cache)
    expected = [[(layer.keys.clone(), layer.values.clone()) for layer in source.layers] for source in sources]
    merged = merged_cache(config, sources, length=6, spare=4)
    for index, layer in enumerate(merged.layers):
        assert isinstance(layer, GrowingLayer) and layer.keys.shape == (5, 2, 6, 4)
        (old_keys, old_values), (new_keys, new_values) = expected[0][index], expected[1][index]
        torch.testing.assert_close(layer.keys[:2, :, 1:], old_keys, rtol=0, atol=0)
        torch.testing.assert_close(layer.values[2:, :, 3:], new_values, rtol=0, atol=0)
        assert (layer.keys[:2, :, :1] == 0).all() and (layer.values[2:, :, :3] == 0).all()
    assert all(layer.keys is None for source in sources for layer in source.layers)
