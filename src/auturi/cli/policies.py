"""ENV and ``--policy`` for the command line: resolving ``module:factory`` specs, probing the
env's spaces, the built-in policies (:func:`auturi.tuner.api.builtin_policy`) and loading a
saved SB3 model's network. Errors are :class:`~auturi.cli.common.CliError` lines naming the fix."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from auturi.cli.common import fail, one_line

__all__ = ["build_policy", "env_note", "probe_spaces", "resolve_env_spec", "sb3_policy"]


def resolve_env_spec(spec: str, raw_frames: bool = False) -> Any:
    """What ``make_executor`` takes for the ENV argument: a gymnasium id (``ALE/Pong-v5``
    imports ``ale_py``), an EnvPool id (``envpool:Pong-v5``), an ALE vector env id
    (``ale:pong``, ale-py's ``AtariVectorEnv``), ``module:factory`` (a callable
    returning a ``gymnasium.Env``), or gymnasium's own ``module:Env-v0`` spelling, returned
    as is so that every worker imports the module before ``gym.make``.

    An Atari id (made by ale-py) becomes :class:`auturi.envs.atari.AtariPreprocessed`: the
    preprocessing and frame stack Atari agents train on, unless ``raw_frames``."""
    from auturi.envs import ALE_PREFIX, ENVPOOL_PREFIX

    spec = spec.strip()
    if not spec:
        fail("ENV is empty: pass a gymnasium id (CartPole-v1), envpool:TASK, ale:GAME or module:factory")
    if spec.startswith(ENVPOOL_PREFIX):
        if importlib.util.find_spec("envpool") is None:
            fail(f"{spec} needs EnvPool, which is not installed: pip install envpool (or 'auturi[envpool]')")
        return spec
    if spec.startswith(ALE_PREFIX):  # before module:factory: no module is named "ale"
        from auturi.envs.ale_vector import INSTALL, ale_vector_available

        if not ale_vector_available():
            fail(f"{spec} needs ale-py's AtariVectorEnv (ale-py >= 0.11), which is not installed: {INSTALL}")
        return spec
    if ":" not in spec:
        return spec if raw_frames else _atari_preprocessed(spec)
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        fail(f"ENV {spec!r}: write module:factory, e.g. my_envs:make_env")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to the user's files import
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        fail(f"ENV {spec!r}: cannot import module {module_name!r} ({e}); check the name and that it is on "
             f"PYTHONPATH or in the current directory")
    except Exception as e:  # noqa: BLE001 - the user's module raised while importing
        fail(f"ENV {spec!r}: importing {module_name!r} raised {type(e).__name__}: {one_line(str(e))}")
    obj: Any = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        import gymnasium as gym

        if attr in gym.registry:  # gymnasium's "module:Env-v0": importing the module registered it
            return spec
        fail(f"ENV {spec!r}: module {module_name!r} has no attribute {attr!r} (and no gymnasium id {attr!r} "
             f"was registered by importing it)")
    if not callable(obj):
        fail(f"ENV {spec!r}: {attr} is a {type(obj).__name__}, not a callable returning a gymnasium.Env")
    return obj


def _atari_preprocessed(spec: str) -> Any:
    """``spec`` itself, or for an Atari id the preprocessed factory (``--raw-frames`` keeps
    the id). An unknown id is returned as is: :func:`probe_spaces` words its error."""
    from auturi.envs import find_env_id

    try:
        env_id, _ = find_env_id(spec)  # imports ale_py for ALE/... ids
    except ValueError:
        return spec
    from auturi.envs.atari import AtariPreprocessed, is_ale_id

    if not is_ale_id(env_id):
        return spec
    if importlib.util.find_spec("cv2") is None:
        fail(f"{spec}: the standard Atari preprocessing (84x84 grayscale, 4 stacked frames) needs OpenCV: pip "
             f"install opencv-python-headless, or pass --raw-frames to tune the raw 210x160 frames")
    return AtariPreprocessed(env_id)


def env_note(env: Any) -> str | None:
    """The line the CLI prints about what ENV became (the Atari preprocessing), or None."""
    from auturi.envs.atari import RECIPE, AtariPreprocessed

    if isinstance(env, AtariPreprocessed):
        return (f"{env.game_id} with the standard Atari preprocessing (SB3's and EnvPool's recipe): frameskip=1 + "
                f"{RECIPE}, observations (4, 84, 84) uint8. Raw frames: --raw-frames; EnvPool's Atari: "
                f"envpool:{_envpool_task(env)}")
    return None


def _envpool_task(env: Any) -> str:
    """EnvPool's task for the game (``ALE/Pong-v5`` -> ``Pong-v5``), or ``TASK``."""
    game = env.game_id
    return game[len("ALE/"):] if game.startswith("ALE/") and game.endswith("-v5") else "TASK"


def probe_spaces(env: Any) -> tuple[Any, Any]:
    """Observation and action space of one env of ``env`` (:func:`auturi.tuner.api.probe_spaces`),
    its errors as one line with the CLI's hints."""
    from auturi.tuner.api import probe_spaces as probe

    try:
        return probe(env)
    except (ValueError, TypeError) as e:
        msg = one_line(str(e))
        if msg.startswith("unknown gymnasium env id"):
            msg = msg.split(" Register it")[0] + (" Check the spelling, or pass ENV as module:factory (a callable "
                                                  "returning a gymnasium.Env), envpool:TASK or ale:GAME.")
        elif msg.startswith("unknown EnvPool task id"):
            msg += " List them with: python -c 'import envpool; print(envpool.list_all_envs())'"
        fail(msg)


def build_policy(kind: str, obs_space: Any, action_space: Any) -> tuple[Any, str]:
    """The policy for ``--policy``: ``auto`` (``cnn`` for image observations, else ``mlp``),
    ``mlp``, ``cnn`` or a saved SB3 model (``PATH.zip``). Returns it and a description."""
    from auturi.tuner.api import builtin_policy

    kind = kind.strip()
    if kind.lower().endswith(".zip") or os.sep in kind:
        return sb3_policy(Path(kind).expanduser(), obs_space, action_space), f"sb3:{Path(kind).name}"
    import gymnasium as gym

    if isinstance(obs_space, (gym.spaces.Dict, gym.spaces.Tuple)):
        # Neither the built-in policies nor a saved SB3 model (whose adapter takes Box,
        # Discrete, MultiDiscrete and MultiBinary) take these: say what does work.
        fail(f"ENV gives {type(obs_space).__name__} observations, which --policy mlp, cnn and saved SB3 models do "
             f"not take: pass ENV as module:factory returning the env wrapped in "
             f"gymnasium.wrappers.FlattenObservation")
    try:
        return builtin_policy(kind, obs_space, action_space, option="--policy ", other="--policy PATH.zip with a "
                              "saved SB3 model")
    except ValueError as e:
        hint = ""
        if kind.lower() == "cnn" and getattr(obs_space, "shape", None) == (210, 160, 3):
            hint = " (these are raw Atari frames: leave out --raw-frames for the 84x84 preprocessing cnn takes)"
        fail(str(e) + hint)


def sb3_policy(path: Path, obs_space: Any, action_space: Any) -> Any:
    """The policy network of a saved SB3 on-policy model, as an auturi policy."""
    if path.is_dir():
        fail(f"--policy {path} is a directory; pass the .zip file model.save() wrote in it, or mlp or cnn")
    if not path.is_file():
        fail(f"--policy {path}: no such file; pass mlp, cnn, or the path of a model saved with model.save()")
    if importlib.util.find_spec("stable_baselines3") is None:
        fail("--policy PATH.zip needs stable-baselines3: pip install stable-baselines3 (or 'auturi[sb3]')")
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.save_util import load_from_zip_file

    from auturi.adapters.sb3 import DISTRIBUTIONS, SB3PolicyAdapter

    try:
        data, params, _ = load_from_zip_file(path, device="cpu", print_system_info=False)
    except Exception as e:  # noqa: BLE001 - a corrupt or foreign zip
        fail(f"--policy {path}: not a readable SB3 model ({type(e).__name__}: {one_line(str(e))})")
    if not data or "policy_class" not in data or not params or "policy" not in params:
        fail(f"--policy {path}: the file holds no SB3 policy (saved with model.save()?)")
    policy_class = data["policy_class"]
    if not (isinstance(policy_class, type) and issubclass(policy_class, ActorCriticPolicy)):
        fail(f"--policy {path}: {getattr(policy_class, '__name__', policy_class)} is not an on-policy "
             f"ActorCriticPolicy (PPO, A2C); off-policy models are not supported")
    m_obs, m_act = data.get("observation_space"), data.get("action_space")
    if m_obs is None or m_act is None:
        fail(f"--policy {path}: the model does not record its spaces; re-save it with a current SB3")
    if getattr(m_obs, "shape", None) != getattr(obs_space, "shape", None) or m_act != action_space:
        fail(f"--policy {path}: the model expects observations {m_obs} and actions {m_act} but the env gives "
             f"{obs_space} and {action_space}; pass ENV as module:factory building the env as the model saw it "
             f"(frame stacking, transposition)")
    if data.get("use_sde"):
        fail(f"--policy {path}: gSDE policies (use_sde=True) are not supported")
    kwargs = dict(data.get("policy_kwargs") or {})
    kwargs["use_sde"] = False
    net = policy_class(m_obs, m_act, lambda _: 0.0, **kwargs)
    net.load_state_dict(params["policy"])
    dist = type(net.action_dist).__name__
    if dist not in DISTRIBUTIONS:
        fail(f"--policy {path}: action distribution {dist} is not supported (use {sorted(DISTRIBUTIONS)})")
    adapter = SB3PolicyAdapter(policy_class, m_obs, m_act, kwargs, dist)
    adapter.load_state({k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})
    return adapter


