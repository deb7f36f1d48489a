"""The SB3 face's env recovery: one :class:`~auturi.adapters.sb3.envs.EnvFactory` per env of a
model's VecEnv, which rebuilds that env (same wrappers, keywords and Monitor) in Auturi's
workers (:func:`factories_from_vecenv`), and the VecEnv wrappers turned into per-env layers
(:func:`split_vec_wrappers`).

The recipe of an env is read from the live env (:func:`_recipe_from_env`): an env id and the
recorded keywords of gymnasium wrappers where they exist, SB3's ``Monitor`` and
``AtariWrapper`` from their attributes, a copy by cloudpickle of the rest. A ``DummyVecEnv``'s
envs are read here; a ``SubprocVecEnv``'s exist only in its worker processes and are read there
by the same code (:class:`_RecipeProbe`), so SB3's workers import this module when the first
probe reaches them.
"""
from __future__ import annotations

import types
from typing import Any

import gymnasium as gym
import numpy as np

from auturi.adapters.sb3.envs import ENV_FN_HINT, EnvFactory, EnvRebuildError
from auturi.adapters.sb3.spec_recipe import _scalars, made_otherwise, spec_recipe


def _atari_kwargs(chain: list[gym.Env]) -> dict[str, Any]:
    """AtariWrapper's constructor kwargs, read back from the wrappers it stacked."""
    names = {type(w).__name__: w for w in chain}
    kw: dict[str, Any] = {
        "noop_max": names["NoopResetEnv"].noop_max if "NoopResetEnv" in names else 0,
        "frame_skip": names["MaxAndSkipEnv"]._skip if "MaxAndSkipEnv" in names else 1,
        "terminal_on_life_loss": "EpisodicLifeEnv" in names,
        "clip_reward": "ClipRewardEnv" in names,
        "action_repeat_probability": (names["StickyActionEnv"].action_repeat_probability
                                      if "StickyActionEnv" in names else 0.0),
    }
    warp = names.get("WarpFrame")
    if warp is not None:
        if warp.width != warp.height:
            raise EnvRebuildError(f"AtariWrapper with a non-square frame ({warp.width}x{warp.height}) cannot be "
                                  f"rebuilt; {ENV_FN_HINT}")
        kw["screen_size"] = warp.width
    return kw


def _gym_chain(env: gym.Env) -> list[gym.Env]:
    """The wrappers of ``env``, outermost first, then the unwrapped env."""
    chain = [env]
    while isinstance(chain[-1], gym.Wrapper):
        chain.append(chain[-1].env)
    return chain


def _base_recipe(base: gym.Env, where: str) -> tuple:
    spec = getattr(base, "spec", None)
    if spec is not None and getattr(spec, "id", None) in gym.registry:
        return spec_recipe(base, spec, where, _pickled)
    return _pickled(base, where, "was not made from a registered gymnasium id")


def _pickled(env: gym.Env, where: str, why: str) -> tuple:
    """A copy of the live ``env`` instance (with everything it wraps), as SB3's SubprocVecEnv
    would ship its factory: cloudpickle. A class defined in the training script pickles by
    value."""
    import cloudpickle

    try:
        blob = cloudpickle.dumps(env)
        copy = cloudpickle.loads(blob)
    except Exception as exc:
        raise EnvRebuildError(
            f"{where}: the env {type(env).__name__} {why} and cannot be copied to another process by pickling "
            f"({type(exc).__name__}: {exc}); {ENV_FN_HINT}") from exc
    try:
        copy.close()
    except Exception:  # noqa: BLE001
        pass
    return ("pickle", blob)


class _SharesInside(Exception):
    """A wrapper's state holds an object of an env it wraps (see :func:`_detached`)."""


_WRAPPER_BOOKKEEPING = ("_action_space", "_observation_space", "_metadata", "_reward_range", "_cached_spec")
"""What ``gymnasium.Wrapper`` keeps of its own; often the inner env's objects (its spaces), and
harmless to copy."""
_ATOMS = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, type, types.FunctionType,
          types.BuiltinFunctionType, gym.spaces.Space, np.dtype)
"""Values an env and its wrapper may both hold without sharing state."""


def _detached(wrapper: gym.Wrapper, inside: list[gym.Env]) -> tuple | str:
    """A ``("state", bytes)`` layer: ``wrapper``'s class and its state but its ``env``,
    cloudpickled, which :func:`_apply_layer` puts back over the env rebuilt inside it, so the
    layers inside are rebuilt as layers (a Monitor writing a file, which no pickle copies, is
    re-created appending to it). Where that copy would not be the same env, the reason: its
    state holds an env of ``inside`` or an object one of them holds (an RNG, a simulator
    handle, an array), which the copy would no longer share with the env it steps; or it
    does not pickle."""
    import io

    import cloudpickle

    state = {key: v for key, v in vars(wrapper).items() if key != "env"}
    inner: dict[int, str] = {}
    for e in inside:
        inner[id(e)] = type(e).__name__
        for key, v in vars(e).items():
            if not isinstance(v, _ATOMS):
                inner.setdefault(id(v), f"{type(e).__name__}.{key}")
    for key in _WRAPPER_BOOKKEEPING:
        inner.pop(id(state.get(key)), None)

    class _Pickler(cloudpickle.Pickler):
        def persistent_id(self, obj: Any) -> None:
            if id(obj) in inner:
                raise _SharesInside(inner[id(obj)])
            return None

    buf = io.BytesIO()
    try:
        _Pickler(buf).dump((type(wrapper), state))
    except _SharesInside as exc:
        return f"its state holds {exc.args[0]} of the env it wraps"
    except Exception as exc:  # noqa: BLE001 - the caller copies the whole env instead, or says why it cannot
        return f"its state does not pickle ({type(exc).__name__}: {exc})"
    return ("state", buf.getvalue())


def _recipe_from_env(env: gym.Env, where: str) -> EnvFactory:
    """A factory that rebuilds ``env`` (a gymnasium env with its wrappers) elsewhere."""
    chain = _gym_chain(env)
    base = chain[-1]
    layers: list[tuple] = []
    recipe: tuple | None = None  # a pickled copy of an unrecorded wrapper and all inside it
    wrappers = chain[:-1][::-1]  # innermost first
    k = 0
    atari_inner = {"StickyActionEnv", "NoopResetEnv", "MaxAndSkipEnv", "EpisodicLifeEnv", "FireResetEnv",
                   "WarpFrame", "ClipRewardEnv"}
    while k < len(wrappers):
        w = wrappers[k]
        cls = type(w)
        mod = cls.__module__
        if cls.__name__ == "Monitor" and mod.startswith("stable_baselines3"):
            if w.reset_keywords:
                raise NotImplementedError(f"{where}: Monitor(reset_keywords={w.reset_keywords}) needs keywords at "
                                          f"reset, which the executor does not pass; {ENV_FN_HINT}")
            if w.results_writer is not None:
                fname = w.results_writer.file_handler.name
                stem = fname.removesuffix(".monitor.csv")
                layers.append(("sb3_monitor", {"filename": stem, "info_keywords": tuple(w.info_keywords),
                                               "allow_early_resets": True}, float(w.t_start)))
            else:
                layers.append(("monitor", tuple(w.info_keywords), float(w.t_start)))
        elif mod.startswith("stable_baselines3.common.atari_wrappers") and cls.__name__ in atari_inner:
            # The wrappers AtariWrapper stacks; an AtariWrapper layer must follow them.
            j = k
            while j < len(wrappers) and type(wrappers[j]).__name__ in atari_inner:
                j += 1
            if j == len(wrappers) or type(wrappers[j]).__name__ != "AtariWrapper":
                raise EnvRebuildError(f"{where}: SB3 Atari wrappers used without AtariWrapper cannot be rebuilt; "
                                      f"{ENV_FN_HINT}")
            layers.append(("atari", _atari_kwargs(wrappers[k:j])))
            k = j  # skip the AtariWrapper itself
        elif isinstance(w, gym.utils.RecordConstructorArgs) and hasattr(w, "_saved_kwargs"):
            kw = {key: v for key, v in w._saved_kwargs.items() if key != "env"}
            layers.append(("kwargs", cls, kw))
        else:
            # A wrapper whose arguments are not recorded (one written in the training script,
            # a make_vec_env wrapper_class): a copy of it alone over the layers inside it, or,
            # where its state reaches inside by more than .env, a copy of it and all it wraps.
            layer = _detached(w, chain[chain.index(w) + 1:])
            if isinstance(layer, tuple):
                layers.append(layer)
            else:
                why = (f"is a wrapper ({cls.__module__}.{cls.__name__}) whose constructor arguments are not recorded "
                       f"(gymnasium wrappers that subclass gymnasium.utils.RecordConstructorArgs are), which cannot "
                       f"be copied alone ({layer})")
                recipe, layers = _pickled(w, where, why), []
        k += 1
    name = base.spec.id if getattr(base, "spec", None) is not None else type(base).__name__
    return EnvFactory(recipe if recipe is not None else _base_recipe(base, where), layers, name=name)


def factories_from_vecenv(venv: Any) -> list[EnvFactory]:
    """One recipe per env of ``venv`` (a VecEnv without its VecEnv wrappers, see
    :func:`split_vec_wrappers`), read from the live envs: a ``DummyVecEnv``'s here, a
    ``SubprocVecEnv``'s in its worker processes (:func:`_factories_from_workers`). Either
    way the same code reads them, so an env gives the same recipe on both."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    if isinstance(venv, DummyVecEnv):
        return [_recipe_from_env(e, f"env {i} of the model's DummyVecEnv") for i, e in enumerate(venv.envs)]
    if isinstance(venv, SubprocVecEnv):
        return _factories_from_workers(venv)
    raise EnvRebuildError(f"the model's VecEnv is a {type(venv).__name__}; auturi.wrap can rebuild the envs of a "
                          f"DummyVecEnv or SubprocVecEnv only; {ENV_FN_HINT}")


PROBE_ATTR = "_auturi_recipe_probe"
"""The attribute :func:`_factories_from_workers` sets on each env of a ``SubprocVecEnv`` for
as long as one ``env_method`` call; the probe removes it."""


class _RecipeProbe:
    """:func:`_recipe_from_env`, run inside one of SB3's ``SubprocVecEnv`` worker processes
    on the live env there.

    A ``SubprocVecEnv`` keeps no env factories: it cloudpickled each to its worker, and
    multiprocessing drops a started process's arguments. The envs, built by the user's
    factories with every wrapper and keyword, exist only in the workers, and SB3's worker
    loop answers only its own commands. Two of them reach the env: ``set_attr`` puts this
    probe on it (its outermost wrapper) and ``env_method`` calls it there. The probe finds
    its env as the one object holding it, removes itself, and answers what the
    ``DummyVecEnv`` path computes for an env in this process: an :class:`EnvFactory`
    (cloudpickled there, so classes and functions of the user's script travel by value).

    It never raises: SB3's worker catches only ``EOFError``, so an exception would end the
    user's worker process. A failure is answered as ``("error", type name, message)``."""

    def __init__(self, where: str, copy_base: str | None = None):
        self.where = where
        self.copy_base = copy_base  # why the caller asks for the live base env itself, pickled

    def __call__(self) -> tuple:
        env = None
        try:
            env = self._holder()
            import cloudpickle

            if self.copy_base is not None:  # the second round (see _copy_where_made_otherwise)
                return ("ok", cloudpickle.dumps(_pickled(env.unwrapped, self.where, self.copy_base)))
            recipe = _recipe_from_env(env, self.where)
            # A base made from an id: its settings, for the caller to compare with envs made
            # from the id where Auturi makes them (this process ran the script's top level).
            live = _scalars(env.unwrapped) if recipe.base[0] == "make" else None
            return ("ok", cloudpickle.dumps(recipe), live)
        except Exception as exc:  # noqa: BLE001 - answered, see the class doc
            return ("error", type(exc).__name__, str(exc))
        finally:
            if env is not None:
                try:
                    delattr(env, PROBE_ATTR)  # the user's env as it was
                except Exception:  # noqa: BLE001 - never raise here (see the class doc)
                    pass

    def _holder(self) -> gym.Env:
        """The env this probe was set on: its referrer (Python 3.11+ keeps a new attribute
        in the object itself until something asks for its ``__dict__``) or the owner of the
        ``__dict__`` that refers to it (a second scan of the worker's objects)."""
        import gc

        for ref in gc.get_referrers(self):
            if isinstance(ref, gym.Env) and getattr(ref, PROBE_ATTR, None) is self:
                return ref
            if type(ref) is dict and ref.get(PROBE_ATTR) is self:
                for owner in gc.get_referrers(ref):
                    if isinstance(owner, gym.Env) and getattr(owner, "__dict__", None) is ref:
                        return owner
        raise LookupError("the env this probe was set on holds it in no way the probe can find")


def _factories_from_workers(venv: Any) -> list[EnvFactory]:
    """One :class:`EnvFactory` per env of a ``SubprocVecEnv``, each made in the env's own
    worker process by :class:`_RecipeProbe`, as :func:`_recipe_from_env` makes it for a
    ``DummyVecEnv``'s env here: whatever built the envs (an id, ``make_vec_env`` with a
    callable, ``wrapper_class``, ``env_kwargs``, ``monitor_dir``, ``make_atari_env``,
    ``SubprocVecEnv([fn] * n)``), with any start method. The VecEnv and its workers are left
    as they were, for ``unwrap_sb3`` and the user's own use; an env that cannot be copied is an
    :class:`EnvRebuildError` naming it, the reason and ``env_fn=``."""
    import cloudpickle

    what = "the model's SubprocVecEnv"
    if venv.closed:
        raise EnvRebuildError(f"{what} is closed, and its envs with it; {ENV_FN_HINT}")
    if venv.waiting:
        raise EnvRebuildError(f"{what} has a step in flight (step_async without step_wait); call step_wait() "
                              f"before auturi.wrap")
    n = int(venv.num_envs)
    try:
        # The class's own calls: a guard another wrap left on the instance (SB3Handle.guard_env_calls) stays out.
        for i in range(n):
            type(venv).set_attr(venv, PROBE_ATTR, _RecipeProbe(f"env {i} of {what}"), indices=[i])
        replies = type(venv).env_method(venv, PROBE_ATTR)
    except (EOFError, OSError) as exc:  # a worker is gone: SB3's pipe to it broke
        raise EnvRebuildError(f"a worker process of {what} is gone ({type(exc).__name__}: {exc}), so its env "
                              f"cannot be read; {ENV_FN_HINT}") from exc
    out, live = [], []
    for i, reply in enumerate(replies):
        if reply[0] == "error":
            kind, message = reply[1], reply[2]
            if kind == "NotImplementedError":
                raise NotImplementedError(message)
            if kind == "EnvRebuildError":
                raise EnvRebuildError(message)
            raise EnvRebuildError(f"env {i} of {what}: reading it in its worker process failed ({kind}: {message}); "
                                  f"{ENV_FN_HINT}")
        try:
            out.append(cloudpickle.loads(reply[1]))
        except Exception as exc:
            raise EnvRebuildError(f"env {i} of {what}: its recipe, made in its worker process, cannot be loaded in "
                                  f"this one ({type(exc).__name__}: {exc}); {ENV_FN_HINT}") from exc
        live.append(reply[2] if len(reply) > 2 else None)
    _copy_where_made_otherwise(venv, out, live, what)
    return out


def _copy_where_made_otherwise(venv: Any, factories: list[EnvFactory], live: list, what: str) -> None:
    """Replace a ``("make", spec)`` base by a pickled copy of the live env where the id makes
    the env otherwise in this process or in a process like Auturi's workers
    (:func:`~auturi.adapters.sb3.spec_recipe.made_otherwise`): a setting the training script
    made at run time, read by the env's constructor. SB3's workers are the envs' truth (plain
    SB3 trains on them); Auturi makes its envs in this process (the serial layout) and in its
    workers, which run none of the script. Found 2026-11-27: the layout changed the rewards.
    A copy that cannot be made keeps the id, with a warning (as for a ``DummyVecEnv``)."""
    import warnings

    import cloudpickle

    for i, (factory, scalars) in enumerate(zip(factories, live)):
        if not scalars or factory.base[0] != "make":
            continue
        changed = made_otherwise(factory.base[1], scalars)
        if not changed:
            continue
        where = f"env {i} of {what}"
        why = (f"is made otherwise by gym.make({factory.base[1].id!r}) outside its worker process ("
               + ", ".join(f"{k}={a!r} there, {b!r} elsewhere" for k, (a, b) in sorted(changed.items())) + ")")
        type(venv).set_attr(venv, PROBE_ATTR, _RecipeProbe(where, copy_base=why), indices=[i])
        reply = type(venv).env_method(venv, PROBE_ATTR, indices=[i])[0]
        if reply[0] == "ok":
            factory.base = cloudpickle.loads(reply[1])
        else:
            warnings.warn(f"{where}: the env {why}, and it cannot be copied ({reply[1]}: {reply[2]}). Auturi's "
                          f"envs are made from its id; pass such settings to gym.make (make_vec_env(..., "
                          f"env_kwargs=...)) or use env_fn=", UserWarning, stacklevel=3)


def split_vec_wrappers(venv: Any) -> tuple[Any, list[tuple], Any]:
    """Walk the VecEnv wrappers: returns (base VecEnv, per-env layers inside out, VecNormalize or None)."""
    from stable_baselines3.common.vec_env import (
        VecCheckNan,
        VecEnvWrapper,
        VecFrameStack,
        VecMonitor,
        VecNormalize,
        VecTransposeImage,
    )

    chain = []
    while isinstance(venv, VecEnvWrapper):
        if not isinstance(venv, VecCheckNan):  # it changes no data: checked in the replay (see nan_checks)
            chain.append(venv)
        venv = venv.venv
    layers: list[tuple] = []
    vecnorm = None
    for pos, w in enumerate(chain):  # outermost first
        if isinstance(w, VecNormalize):
            if pos != 0:
                raise NotImplementedError(
                    f"VecNormalize must be the outermost VecEnv wrapper for auturi.wrap (found under "
                    f"{type(chain[0]).__name__}); build the VecEnv as VecNormalize({type(chain[0]).__name__}(...)) "
                    f"instead")
            if isinstance(w.observation_space, gym.spaces.Dict):
                raise NotImplementedError("VecNormalize with Dict observations is not supported by auturi.wrap")
            vecnorm = w
        elif isinstance(w, VecFrameStack):
            if isinstance(w.observation_space, gym.spaces.Dict):
                raise NotImplementedError("VecFrameStack with Dict observations is not supported by auturi.wrap")
            layers.insert(0, ("framestack", w.stacked_obs.n_stack, bool(w.stacked_obs.channels_first)))
        elif isinstance(w, VecTransposeImage):
            if not w.skip:
                if isinstance(w.observation_space, gym.spaces.Dict):
                    raise NotImplementedError("VecTransposeImage with Dict observations is not supported by auturi.wrap")
                layers.insert(0, ("transpose",))
        elif isinstance(w, VecMonitor):
            if w.results_writer is not None:
                raise NotImplementedError(
                    "VecMonitor(filename=...) is not supported by auturi.wrap: wrap each env in "
                    "Monitor(env, filename) instead (make_vec_env(..., monitor_dir=...) does)")
            # VecMonitor sums the VecEnv's rewards in a float32 array: a DummyVecEnv's are float32,
            # a SubprocVecEnv's float64 (added, then rounded to float32)
            from stable_baselines3.common.vec_env import SubprocVecEnv

            sums = "float64" if isinstance(venv, SubprocVecEnv) else "float32"
            layers.insert(0, ("monitor", tuple(w.info_keywords), float(w.t_start), sums))
        else:
            raise NotImplementedError(
                f"the VecEnv wrapper {type(w).__name__} is not supported by auturi.wrap (supported: VecNormalize "
                f"as the outermost wrapper, VecFrameStack, VecTransposeImage, VecMonitor, VecCheckNan). Apply its "
                f"per-env equivalent as a gymnasium wrapper inside your env (and pass env_fn=), or train without "
                f"auturi")
    return venv, layers, vecnorm


def nan_checks(venv: Any) -> list[tuple[Any, bool]]:
    """The ``VecCheckNan`` wrappers around the model's VecEnv, outermost first, each with
    whether it sits above ``VecNormalize`` (it then checks normalised observations and rewards,
    in which VecNormalize has clipped an inf away). They change no data, so
    :func:`split_vec_wrappers` passes over them; the replay runs their checks on each step's
    actions, observations, rewards and dones (:func:`auturi.adapters.sb3.on_policy.check_step`),
    as their ``step_async`` / ``step_wait`` do. Refused before 2026-11-26, though SB3's docs
    suggest wrapping the training env in it to find where a NaN comes from."""
    from stable_baselines3.common.vec_env import VecCheckNan, VecEnvWrapper, VecNormalize

    found: list[Any] = []
    out: list[tuple[Any, bool]] = []
    while isinstance(venv, VecEnvWrapper):
        if isinstance(venv, VecNormalize):
            out.extend((w, True) for w in found)
            found = []
        elif isinstance(venv, VecCheckNan):
            found.append(venv)
        venv = venv.venv
    return out + [(w, False) for w in found]


def same_space(a: gym.Space, b: gym.Space) -> bool:
    try:
        if a == b:
            return True
    except Exception:  # noqa: BLE001
        pass
    return type(a) is type(b) and getattr(a, "shape", None) == getattr(b, "shape", None) and \
        getattr(a, "dtype", None) == getattr(b, "dtype", None)


