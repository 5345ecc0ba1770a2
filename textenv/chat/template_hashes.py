"""The sha256 of every chat template `textenv.chat.families.recognise_family` knows byte for byte.

Keys are the hex digest of the template's UTF-8 text; values are the template's name (its file
``tests/fixtures/chat_templates/real/<name>.jinja``, where its source and licence are listed) and the family's
name. ``tests/test_chat_families.py`` checks that every vendored template is here with its current digest.
"""

from typing import Dict, Tuple

KNOWN_TEMPLATES: Dict[str, Tuple[str, str]] = {
    "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f": ("qwen2_5", "qwen2_5"),
    "0cd86fb80f520885e35040a8df321540e729d3358da41f27cf74d33103d94f62": ("qwen2_5_training", "qwen2_5"),
    "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8": ("qwen3", "qwen3"),
    "1d944ff8f268b611abb296cdd24d0f51981eef1c8647ac321c3a0258f61eb6c9": ("qwen3_training", "qwen3"),
    "273d8e0e683b885071fb17e08d71e5f2a5ddfb5309756181681de4f5a1822d80": ("qwen3_5_nothink", "qwen3_5"),
    "f32fe3e21c20f59d193244181c8b4c324c73a8cd313ddf825633a9ecfd2afad2": ("qwen3_5_nothink_training", "qwen3_5"),
    "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715": ("qwen3_5_think", "qwen3_5"),
    "ccf356d8f238e287c047b1ef589850fd6b2b44e6cb29079e26c635fb9b8111ef": ("qwen3_5_think_training", "qwen3_5"),
    "ab7813c3abdd9cb655905a410728b26c7884eca45ddfab8d9f931553485a7862": ("nemotron_3_nano", "nemotron_3_nano"),
    "f52a4a70292b98db4d1b9f69a59546a43fc5e8603a6794781973a3e5821bd475": ("nemotron_3_nano_training", "nemotron_3_nano"),
    "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65": ("llama3_1", "llama3"),
    "5816fce10444e03c2e9ee1ef8a4a1ea61ae7e69e438613f3b17b69d0426223a4": ("llama3_2", "llama3"),
    "7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4": ("gemma3", "gemma3"),
    "959b257e7fc1603f8cae9c9890e62f43d6ded6c0f72b9b73c4106a4ceaa096fc": ("gemma3_training", "gemma3"),
    "33204f1acb5bd0002713e16a593847f24ceeafe711ed88bda2a352dc996a3373": ("gemma4", "gemma4"),
    "0a2c8073c878ab1da004bee933a998606537bbb62016310352c7285c3f01c5b5": ("gemma4_v5", "gemma4"),
    "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146": ("gptoss", "gpt_oss"),
    "6adda7cea0f63ef14918be7f26100b324525b6185a8f06932914388ffaa52e32": ("gptoss_training", "gpt_oss"),
    "56a1447ad31926fdc21fb07e56e5642bd9c850c4f52d8c8af7bbe5f079a84f5f": ("deepseek_r1_distill", "deepseek_r1_distill"),
    "439ca50e037bdf26b9e654e3eaa559fdd19d41e602307bcb133451070eb2ee3e": ("deepseek_r1_distill_training", "deepseek_r1_distill"),
    "563b1ce7d61d50a9b4c7439a912a1116f095b712df5b5e4d3e1116049874eb64": ("deepseekv3", "deepseek_v3"),
    "aadb4942004c186f9ba97d28f653d7f2e0dc20e4275352a486f7cafbe4dd7b51": ("deepseekv3_training", "deepseek_v3"),
    "ff9922c622b4c361fbdbc283ba8360f9ade2b53115d46fb5c5955630f483e30b": ("mistral_v13_tekken", "mistral"),
    "1c81156eb793782cbbbd78cb36f8ed2a1f9398d046c36e1aa3d7054bb34ca3e9": ("mistral_v7_tekken", "mistral"),
    "78d976a442bcde2f0be15aafbb8e3050e1104f86732266f68403251b89982a90": ("phi3_5", "phi3_5"),
    "a76a9651a9785afe269c6b91598d55f03ab8adf3d8489a4a9c8ef432128b7c08": ("phi3_5_training", "phi3_5"),
    "febf589225c9728ab791f52e8897d7607a823d45368f0a4c92fa68997b40cce9": ("phi4_mini", "phi4_mini"),
    "44f815868bf02fa458dd2f741a338046f4bf45f398eb6d067766726b9d96cce3": ("glm4moe", "glm4_moe"),
    "18cbc5123073ee4a3253b729dcb00fef6665cba76ec86f3e6803db23ce85ca2f": ("glm4moe_training", "glm4_moe"),
    "cef187400d62a59507aab3a642ea9a8d2a2ef263562bc3430560e116945273cf": ("lfm2", "lfm2"),
    "6d65c8804847ad74eea912dd7eca3dc1cf7a457b53a77f47d841a14121910963": ("lfm2_2_5", "lfm2_5"),
    "fc29163f52185634af234b57c358b231f22e9a266f8ecba90627e47a03626103": ("lfm2_training", "lfm2"),
    "5504d163d879bfb6fd4135b7fa3d56768b2e69dd718338f7b146750289f46ab0": ("lfm2_v2", "lfm2"),
    "fd9c5f7cb11511f72c3db43496380e4b40e7a6110a978dc27cf338ddec45efb2": ("lfm2_v2_training", "lfm2"),
}
