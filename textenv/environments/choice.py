"""Which environment kind a run plays: the one argument of `GymScheduler` that names it (`chosen_kind`), and
for a loaded verifiers environment the adapter that plays it (`verifiers_kind`: classic, verifiers 0.3,
`textenv.environments.verifiers`, or v1 tasksets, verifiers 0.4.0, `textenv.environments.verifiers_v1`; verifiers is
imported only then)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from textenv.environments.kind import EnvironmentKind, RoutedKinds


def chosen_kind(
    *,
    environments: Union[EnvironmentKind, Mapping[str, EnvironmentKind], None] = None,
    gym_env: Optional[str] = None,
    environment_factory: Any = None,
    tools: Optional[Sequence[Callable]] = None,
    reward_funcs: Any = None,
    verifiers_env: Any = None,
    max_turns: Optional[int] = None,
    model: Any = None,
    generation_kwargs: Optional[dict] = None,
) -> EnvironmentKind:
    """The kind a `GymScheduler` plays, from the one of `environments`, `gym_env`, `environment_factory` and
    `verifiers_env` given (see `GymScheduler`): registered Gym envs when none is.

    Raises:
        ValueError: two of them given, `tools`/`reward_funcs` without `environment_factory`, `max_turns` with
            `verifiers_env`.
        TypeError: `environments` is not a kind nor a dict of kinds.
    """
    from textenv.gym.registry import RegisteredEnvs
    from textenv.environments.trl import TrlEnvironments

    if environments is not None and (gym_env, environment_factory, verifiers_env) != (None, None, None):
        raise ValueError("GymScheduler: environments= names every kind this run plays; leave gym_env, environment_factory and verifiers_env out.")
    if verifiers_env is not None and (gym_env is not None or environment_factory is not None):
        raise ValueError("GymScheduler: give one of gym_env, environment_factory and verifiers_env.")
    if gym_env is not None and environment_factory is not None:
        raise ValueError("GymScheduler: give gym_env (a registered Env) or environment_factory (TRL environments), not both.")
    if (tools or reward_funcs) and environment_factory is None:
        raise ValueError("GymScheduler: tools= and reward_funcs= go with environment_factory= (TRL environments); pass it too.")
    if environment_factory is not None:
        return TrlEnvironments(environment_factory, tools=tools, reward_funcs=reward_funcs)
    if verifiers_env is not None:
        if max_turns is not None:
            raise ValueError(
                f"GymScheduler: max_turns={max_turns} with verifiers_env; the environment's own max_turns ends its "
                "episodes: load it with that argument (vf.load_environment(ID, max_turns=N)) and leave max_turns=None here."
            )
        return verifiers_kind(verifiers_env, model, generation_kwargs)
    if isinstance(environments, Mapping):
        environments = RoutedKinds(environments)
    if environments is None:
        return RegisteredEnvs(gym_env)
    if not isinstance(environments, EnvironmentKind):
        raise TypeError(f"environments: a {type(environments).__name__} is not an environment kind (textenv.environments.EnvironmentKind), nor a dict of them.")
    if environments.ends_its_episodes and max_turns is not None:
        raise ValueError(f"GymScheduler: max_turns={max_turns} with a verifiers kind among environments; its own max_turns ends its "
                         "episodes: leave max_turns=None (the other kinds then need their own end: done, or max_length).")
    return environments


def verifiers_kind(verifiers_env: Any, model: Any = None, generation_kwargs: Optional[dict] = None) -> EnvironmentKind:
    """The environment kind that plays `verifiers_env`, recording `model`'s name and the sampling settings of
    `generation_kwargs` as verifiers' rollouts do.

    Raises:
        TypeError: a v1 environment while verifiers 0.4.0 is not installed.
        ImportError: a classic environment while verifiers 0.3 is not installed.
    """
    from textenv.environments.verifiers_messages import V1_RELEASE, installed_verifiers, is_v1_environment

    name = getattr(getattr(model, "config", None), "_name_or_path", None) or "textenv"
    kwargs = generation_kwargs or {}
    sampling = {"max_tokens": kwargs.get("max_new_tokens"), "temperature": kwargs.get("temperature", 1.0) if kwargs.get("do_sample") else 0.0}
    if is_v1_environment(verifiers_env):
        installed = installed_verifiers()
        if not installed.startswith(V1_RELEASE):
            raise TypeError(
                f"verifiers_env: {type(verifiers_env).__name__} is a verifiers v1 environment; textenv drives v1 tasksets with "
                f"verifiers 0.4.0 (pip install 'textenv[verifiers-v1]'), and verifiers {installed} is installed (its v1 is a "
                "preview textenv does not drive; its classic environments are supported)."
            )
        from textenv.environments.verifiers_v1 import V1Environments

        return V1Environments(verifiers_env, model_name=name, sampling=sampling)
    try:
        from textenv.environments.verifiers import VerifiersEnvironments
    except ImportError as error:
        raise ImportError(f"verifiers_env needs verifiers 0.3 for a classic environment ({error}): pip install 'textenv[verifiers]'.") from error
    return VerifiersEnvironments(verifiers_env, model_name=name, sampling_args=sampling)
