"""Ready-made tasks (prompt, task generator, reward) shared by the demo, examples, tests and benchmarks."""
