"""The adapter contract: what one kind of environment gives the Gym scheduler.

Every kind textenv plays (ms-swift-style Gym `Env`s, TRL 1.x environment classes, verifiers classic and v1,
OpenEnv servers, MCP tool servers) is an `EnvironmentKind`: it turns a dataset row into a fresh `Env` for one
episode, keeps what must live for a whole run (a server, an endpoint) in `serving`, and may score a row's
episodes together. `GymPlay` drives every kind through these methods alone, so a new kind is a new module
behind this contract: neither the episode driver nor the front ends gain a branch for it.

`RoutedKinds` plays several kinds in one run, each row routed by its `env_kind` column.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, AsyncContextManager, Callable, Dict, List, Mapping, Optional, Protocol, runtime_checkable

if TYPE_CHECKING:
    from textenv.gym.env import Env

KIND_FIELD = "env_kind"  # the row column that picks a kind when a run plays several


class GroupScoring(Protocol):
    """Scores a row's episodes together once all of them have ended (verifiers' rubrics)."""

    tasks: set

    def add(self, index: int, play: Any) -> None:
        """Take episode `index` when it ends; call the run's `finish(index, play)` once its group is scored."""

    async def wait(self) -> None:
        """Return once every group taken so far is scored and finished."""


@runtime_checkable
class EnvironmentKind(Protocol):
    """One kind of environment, as `GymScheduler(environments=...)` plays it.

    Attributes:
        kind (`str`): the kind's name, recorded in each episode (``"gym"``, ``"trl"``, ``"verifiers"``,
            ``"verifiers-v1"``, ``"openenv"``, ``"mcp"``).
        ends_its_episodes (`bool`): the kind's own turn limit and stop conditions end its episodes, so a run
            that plays it takes no `max_turns` (verifiers).
    """

    kind: str
    ends_its_episodes: bool

    def env_name(self, row: Mapping[str, Any]) -> Optional[str]:
        """The name an episode of `row` is logged under (its `env` in `completions.jsonl`)."""

    def adapter(self, row: Mapping[str, Any], index: int) -> "Env":
        """A fresh `Env` for one episode of `row` (row `index` of the run). Nothing is started until its
        `reset`; the episode driver calls `close` exactly once, also at `max_turns`, on errors and on
        cancellation. Raises for a row this kind cannot play (the episode then ends with a `config` error)."""

    def serving(self) -> AsyncContextManager[None]:
        """What lives for a whole run (a server process, an endpoint): entered before the first episode and
        exited after the last, whatever happened."""

    def group_scoring(self, num_generations: int, finish: Callable[[int, Any], None], timeout: Optional[float]) -> Optional[GroupScoring]:
        """A `GroupScoring` when a row's `num_generations` episodes are scored together, else `None` (each
        episode scores itself in its `Env`, and `finish` is called as each ends)."""

    def check(self, max_concurrency: int, num_generations: int) -> None:
        """Refuse, before any episode, a run this kind cannot serve (a session cap below `max_concurrency`),
        with a one-line `ValueError` naming the argument and the fix."""


class SimpleKind:
    """Defaults for a kind whose episodes need nothing for the whole run and score themselves."""

    kind = "env"
    ends_its_episodes = False

    def serving(self) -> AsyncContextManager[None]:
        return contextlib.nullcontext()

    def group_scoring(self, num_generations: int, finish: Callable[[int, Any], None], timeout: Optional[float]) -> None:
        return None

    def check(self, max_concurrency: int, num_generations: int) -> None:
        return None


class RoutedKinds:
    """Several kinds in one run: each row's `env_kind` column names the kind that plays it.

    Args:
        kinds (`dict[str, EnvironmentKind]`): the kinds, by the name rows give in `env_kind`.
    """

    kind = "routed"

    def __init__(self, kinds: Mapping[str, EnvironmentKind]):
        if not kinds:
            raise ValueError("environments: the dict is empty; map at least one name to an environment kind.")
        for name, kind in kinds.items():
            if not isinstance(kind, EnvironmentKind):
                raise TypeError(f"environments[{name!r}] is a {type(kind).__name__}, not an environment kind (textenv.environments.EnvironmentKind).")
        self.kinds: Dict[str, EnvironmentKind] = dict(kinds)
        self.ends_its_episodes = any(kind.ends_its_episodes for kind in self.kinds.values())

    def route(self, row: Mapping[str, Any]) -> tuple[str, EnvironmentKind]:
        """`(name, kind)` of the kind `row` names.

        Raises:
            ValueError: the row names no kind, or one that is not among `kinds`.
        """
        name = row.get(KIND_FIELD)
        if name not in self.kinds:
            problem = f"has no {KIND_FIELD!r} column" if name is None else f"has {KIND_FIELD}={name!r}, which is not among them"
            raise ValueError(f"the run plays several environment kinds and the row {problem}: give each row {KIND_FIELD} = one of {sorted(self.kinds)}.")
        return name, self.kinds[name]

    def env_name(self, row: Mapping[str, Any]) -> Optional[str]:
        try:
            return self.route(row)[1].env_name(row)
        except ValueError:
            return row.get(KIND_FIELD)

    def adapter(self, row: Mapping[str, Any], index: int) -> "Env":
        return self.route(row)[1].adapter(row, index)

    def serving(self) -> AsyncContextManager[None]:
        @contextlib.asynccontextmanager
        async def all_serving():
            async with contextlib.AsyncExitStack() as stack:
                for kind in self.kinds.values():
                    await stack.enter_async_context(kind.serving())
                yield

        return all_serving()

    def group_scoring(self, num_generations: int, finish: Callable[[int, Any], None], timeout: Optional[float]) -> Optional["RoutedScoring"]:
        scorings = {name: kind.group_scoring(num_generations, finish, timeout) for name, kind in self.kinds.items()}
        if all(scoring is None for scoring in scorings.values()):
            return None
        return RoutedScoring(scorings, finish)

    def check(self, max_concurrency: int, num_generations: int) -> None:
        for kind in self.kinds.values():
            kind.check(max_concurrency, num_generations)


class RoutedScoring:
    """Each episode to its own kind's group scoring, or straight to `finish` when its kind has none."""

    def __init__(self, scorings: Mapping[str, Optional[GroupScoring]], finish: Callable[[int, Any], None]):
        self.scorings = dict(scorings)
        self.finish = finish

    @property
    def tasks(self) -> set:
        return set().union(*(scoring.tasks for scoring in self.scorings.values() if scoring is not None))

    def add(self, index: int, play: Any) -> None:
        scoring = self.scorings.get(play.result.env_kind)
        if scoring is None:
            self.finish(index, play)
        else:
            scoring.add(index, play)

    async def wait(self) -> None:
        for scoring in self.scorings.values():
            if scoring is not None:
                await scoring.wait()


def kind_names(kinds: EnvironmentKind) -> List[str]:
    """The names a run's episodes are counted under: each routed kind's name, else the kind's own."""
    return list(kinds.kinds) if isinstance(kinds, RoutedKinds) else [kinds.kind]
