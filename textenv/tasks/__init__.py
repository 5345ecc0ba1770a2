"""Ready-made tasks (prompt, task generator, reward) shared by the demo, examples, tests and benchmarks.

- `calculator`: the legacy calculator task (`What is a op b?`), its 2-shot prompt and exact-match rewards;
- `triviaqa`: questions about an invented encyclopedia of towns, answered with the `WikiSearch` tool;
- `word_problems`: arithmetic word problems solved with the `PythonInterpreter` tool.

May import: textenv.jsonl, textenv.tools
"""
