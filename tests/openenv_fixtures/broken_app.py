"""An app module that fails while it loads, as a server whose environment cannot start does."""

raise RuntimeError("the fixture's game data is missing")
