"""The reward of examples/mcp_servers/notes_server.py's episodes: a TRL reward function, as
``--reward_funcs examples/mcp_servers/rewards.py:saved_the_note`` (or ``McpServers(..., reward_funcs=[...])``)
takes it, that reads the episode's own server once the episode has ended."""


async def saved_the_note(prompts, completions, environments, title, **kwargs):
    """1.0 when the note the row asks for (its `title` column) was saved in the episode's server, else 0.0.

    Called as TRL calls a reward function, with one-element lists: `environments[0]` is the episode, whose
    `call_tool` calls its server's tools by the names the model sees.
    """
    titles = (await environments[0].call_tool("list_titles")).splitlines()
    return [1.0 if title[0] in titles else 0.0]
