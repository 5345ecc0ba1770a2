from glossary.taskset import GlossaryTaskset

__all__ = ["GlossaryTaskset"]
