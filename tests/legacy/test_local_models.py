"""Checks of the offline stand-ins themselves (not a TRL test file): the GPT-2 tokenizer is OpenAI's, and every
tiny model has exactly the weights the expected numbers in the ported tests were computed with, in whichever
venv (transformers 5.x for textenv, 4.46.3 for trl 0.11.4) built it.

If you change a model in local_models.py on purpose, print the new digests with
`python tests/legacy/local_models.py` (in both venvs: they must agree), update the table below, and recompute
the numbers that depend on the weights on trl 0.11.4 (see README.md: test_loss_trainer).
"""

import unittest

from .local_models import SPECS, gpt2_tokenizer, weights_digest

# sha256 over the (shape, values) of each model's tensors; torch 2.13.0, identical in both venvs.
EXPECTED_DIGESTS = {
    "trl-internal-testing/tiny-random-CodeGenForCausalLM":
        "6e8d254bd6b866fa27d70695535c0fc21b239416876f6fbd092483a6f6deb818",
    "trl-internal-testing/tiny-random-CodeGenForCausalLM-sharded":
        "e2966baf657885c89e738017eb37d98b43ae8ac323752df79fe5c6acef1ef644",
    "trl-internal-testing/tiny-random-GPTJForCausalLM":
        "cb8395185e4a1e0f2fdd2c11ddd7ca5c595f1b5a08a13a0d2fbb73b51b3bca30",
    "trl-internal-testing/tiny-random-GPTNeoForCausalLM":
        "ebd4719cfe2d01ac23eef0e84b5914fdd619f3f1ae7302775f3bd3cc09738cb9",
    "trl-internal-testing/tiny-random-GPTNeoXForCausalLM":
        "ef9ac20718b59c77268ff2bea180deb873a41f47af0df4571840ba9f1184d650",
    "trl-internal-testing/tiny-random-GPTNeoXForCausalLM-safetensors":
        "c405d836a8259aa0d8a86c4d3c20205a93e665e6be53e82c9246d5deeb9ca529",
    "trl-internal-testing/tiny-random-GPTNeoXForCausalLM-safetensors-sharded":
        "7875474d1496df55b301d0dfb1ed59d8c5bdd489aaba95d8c69e827c52f478e4",
    "trl-internal-testing/tiny-random-OPTForCausalLM":
        "61fd884625b4fb3e55535065dd4f95081d989461df27f5ef482d66e0b5c6453d",
    "trl-internal-testing/tiny-random-BloomForCausalLM":
        "c8ad747da6f0e234d5dc6ce7719a04608d0c2a45ce480704cd54573897b6c22b",
    "trl-internal-testing/tiny-random-GPT2LMHeadModel":
        "e2b76581d02481dcf3676c707bee4ba2675b0d62b440fe37783f088a22a8ced3",
    "trl-internal-testing/tiny-random-LlamaForCausalLM":
        "2841af26e111197118ff7e52bbd94f7dab57c2eaacc956cd073d1f74bd8c04c5",
    "trl-internal-testing/tiny-random-GPT2Model": "f93d2ea655f532009da68a2c06075c3aca5126de5bc3920bc422cb1d357004f8",
    "trl-internal-testing/tiny-random-T5Model": "7deab7295cbc787f6468b1f91100b78e4ff688590fd25c3f855d7a93f3b191c1",
    "trl-internal-testing/dummy-GPT2-correct-vocab": "78ef72bc6cbcb0295540bb1ef54ee74db6a959e80989eebeb4a9d1627cbbe260",
    "gpt2": "6a01548c5e1f2401789a0a2993a913cfdb73dc4f877c9dce4a2432f8bbb45c51",
    "trl-internal-testing/tiny-BloomForCausalLM-correct-vocab":
        "ba6ba1f4ecd9a1736851079bee997b66e237fa3acdc38c98e6776e5ef542056a",
    "trl-internal-testing/tiny-T5ForConditionalGeneration-correct-vocab":
        "f885ba82ff45a5fac3c6d327784385a4f4f7e0b0b17fcfe9cb700c67893c4715",
    "trl-internal-testing/tiny-random-BartForConditionalGeneration":
        "ea5652cd8bb6b41f9e622d68eb31424b4bc1bff29afd7660e8edad6df0f910f3",
    "trl-internal-testing/tiny-random-BigBirdPegasusForConditionalGeneration":
        "56deb6deaf87141a2f2d4829404c58c6fc2fef2dd60de0a14e97d17b4db7faf1",
    "trl-internal-testing/tiny-random-BlenderbotForConditionalGeneration":
        "189a1471d218bc16ceb2658fc906be985d03847f2b037d06e3499caa73e62578",
    "trl-internal-testing/tiny-random-BlenderbotSmallForConditionalGeneration":
        "52fce26be11c53559749675e382a142197c4cdaf61ea4f43ca03971cbf1d4fdb",
    "trl-internal-testing/tiny-random-FSMTForConditionalGeneration":
        "eb93ab92e7179d64ce7e034288c02724580f8ff88ed2534b51f23c2cf06f3638",
    "trl-internal-testing/tiny-random-LEDForConditionalGeneration":
        "509d27806e36dddd0092f8e522eb09a23cec878f1cba07793b4070dca2ad70d9",
    "trl-internal-testing/tiny-random-LongT5ForConditionalGeneration":
        "303c52533b0c5eeea023280efa1fcbcae33676f0ee64f31bf39cfd6a313b0021",
    "trl-internal-testing/tiny-random-M2M100ForConditionalGeneration":
        "59a7be51fe3ff613f4c430eebc0e153686c942fdfa1dcc22f9a5bc6bf4e3ec4e",
    "trl-internal-testing/tiny-random-MarianMTModel":
        "9bd025ffd0f4b043cda3e2d33127ca5313170cf3443fed5a95a8e2773e409e3e",
    "trl-internal-testing/tiny-random-MBartForConditionalGeneration":
        "37a798eaf6f0a83cc429ced4454f5b6f6a4d5af47c0358bfebd3443c653e3f65",
    "trl-internal-testing/tiny-random-MT5ForConditionalGeneration":
        "b4940192e66bfe5144a9ede45c3eab14156006dcba72a2205e989c4448053787",
    "trl-internal-testing/tiny-random-MvpForConditionalGeneration":
        "8a5ff50d2a36c92bf8347ad3fb8ea6bb5667da76b362f9edf03a494c1a6cd32f",
    "trl-internal-testing/tiny-random-PegasusForConditionalGeneration":
        "a174340f6c839c564d7a996c971dedeec339dc3310d750abc5fb7c50b92234e8",
    "trl-internal-testing/tiny-random-PegasusXForConditionalGeneration":
        "7eddd0693b2716e1b252b785440fd58d13cac1c6824c5d0482dda97cd0d171c9",
    "trl-internal-testing/tiny-random-PLBartForConditionalGeneration":
        "9e3416dff2d52241084a7c9028d9abe86bf2278a80b0eff2abbdc1379f19844f",
    "trl-internal-testing/tiny-random-ProphetNetForConditionalGeneration":
        "07aa085fe90fb28aa117bec147388f4d55d0fbab2fc34d7f5709d9cef256b6f6",
    "trl-internal-testing/tiny-random-SwitchTransformersForConditionalGeneration":
        "9d604f78d62e7d4a904dee8b7539c1d651f73213b10c5cf3d6fb71edf3a076c9",
    "trl-internal-testing/tiny-random-T5ForConditionalGeneration":
        "f82956e25fb95581160c15cf0a0e3299c149fd0e9165f2018de175b2bff34bca",
}


class LocalModelsTest(unittest.TestCase):
    def test_every_hub_id_has_a_pinned_digest(self):
        assert set(EXPECTED_DIGESTS) == set(SPECS)

    def test_weights_are_the_pinned_ones(self):
        digests = {hub_id: weights_digest(hub_id) for hub_id in SPECS}
        wrong = {hub_id: digest for hub_id, digest in digests.items() if digest != EXPECTED_DIGESTS[hub_id]}
        assert not wrong, f"stand-in weights differ from the pinned ones (expected numbers no longer apply): {wrong}"

    def test_gpt2_tokenizer_is_openais(self):
        tokenizer = gpt2_tokenizer()
        assert len(tokenizer) == 50257
        assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.unk_token == "<|endoftext|>"
        assert tokenizer.eos_token_id == 50256
        assert tokenizer("Hello world")["input_ids"] == [15496, 995]
        assert tokenizer(" Hello world")["input_ids"] == [18435, 995]
        assert tokenizer.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"
