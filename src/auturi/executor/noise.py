"""Exploration noise: the uniform numbers each env's actions are sampled with.

The executor draws them, not the policy, so that which random numbers an env sees never
depends on the layout (batching, actors, processes) or on how the steps are split into
collects: env ``i``'s numbers at its step ``t`` are a function of ``(seed, i, t)`` alone,

    row ``t % BLOCK_ROWS`` of ``np.random.default_rng([seed, i, t // BLOCK_ROWS])
    .random((BLOCK_ROWS, k), dtype=np.float32)``

(:func:`reference_noise` spells it out). Blocks, not one stream per collect: an off-policy
collect is often one step, and building 8 generators for 8 numbers each cost ~15 us an env
(~120 us of a 1-step collect); a block is built once per ``BLOCK_ROWS`` steps and each collect
copies a slice of it.

Example:
    >>> streams = NoiseStreams()
    >>> a = np.zeros((3, 2, 1), np.float32)
    >>> streams.fill(a, seed=7, first_env=4, steps_done=254)  # rows 254, 255 and 256: two blocks
    >>> np.array_equal(a[:, 1], reference_noise(7, 5, 254, 3, 1))
    True
"""
from __future__ import annotations

import sys

import numpy as np

BLOCK_ROWS = 256
"""Steps per block of an env's noise. Part of the data contract (changing it changes every
action drawn): large enough that 1-step collects rarely build one, small enough that a block
of every env stays small (256 envs x 17 action dims: 4.5 MB)."""


def reference_noise(seed: int, env: int, first_step: int, rows: int, k: int) -> np.ndarray:
    """Env ``env``'s noise for steps ``first_step .. first_step + rows - 1``, ``(rows, k)``,
    straight from the definition (slow: for tests and for replaying it outside an executor)."""
    out = np.empty((rows, k), np.float32)
    for r in range(rows):
        block, row = divmod(first_step + r, BLOCK_ROWS)
        out[r] = np.random.default_rng([seed, env, block]).random((BLOCK_ROWS, k), dtype=np.float32)[row]
    return out


class NoiseStreams:
    """The noise of a run of envs, served from the current block of every env (one block is
    kept: steps only go forward)."""

    def __init__(self) -> None:
        self._key: tuple | None = None  # (seed, first_env, envs, k, block index) of _block
        self._block: np.ndarray | None = None

    def fill(self, noise: np.ndarray, seed: int, first_env: int, steps_done: int) -> None:
        """Fill ``noise`` (``float32``, rows x envs x k) with the numbers of envs
        ``first_env ..`` for steps ``steps_done ..``."""
        rows, n, k = noise.shape
        r = 0
        while r < rows:
            index, offset = divmod(steps_done + r, BLOCK_ROWS)
            take = min(BLOCK_ROWS - offset, rows - r)
            noise[r:r + take] = self._current(seed, first_env, n, k, index)[offset:offset + take]
            r += take

    def _current(self, seed: int, first_env: int, n: int, k: int, index: int) -> np.ndarray:
        key = (seed, first_env, n, k, index)
        if key != self._key or self._block is None:
            if self._block is None or self._block.shape != (BLOCK_ROWS, n, k):
                self._block = np.empty((BLOCK_ROWS, n, k), np.float32)
            self._key = None  # a failed fill leaves no stale key behind
            fill_noise(self._block, seed, first_env, index)
            self._key = key
        return self._block


_U32, _M32 = 1 << 32, (1 << 32) - 1
_M128 = (1 << 128) - 1
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645  # PCG64's 128-bit LCG multiplier (numpy's pcg64.h)


def _state_consts() -> list[tuple[int, int]]:
    """SeedSequence.generate_state's hash constants for 8 words: (before, after) each
    multiplication (numpy's INIT_B, MULT_B); they do not depend on the data."""
    out, h = [], 0x8B51F9DD
    for _ in range(8):
        nxt = (h * 0x58F38DED) & _M32
        out.append((h, nxt))
        h = nxt
    return out


_STATE_CONSTS = _state_consts()


def fill_noise(noise: np.ndarray, seed: int, first_env: int, steps_done: int) -> None:
    """Fill ``noise[:, i, :]`` (``float32``, rows x envs x k) with
    ``np.random.default_rng([seed, first_env + i, steps_done]).random((rows, k))``
    (:class:`NoiseStreams` calls it with a block index for ``steps_done``).

    Bit for bit that stream, built in ~7 us an env instead of ``default_rng``'s ~12 (a
    SeedSequence from a list, its ``generate_state``, a new PCG64 and Generator): at 8 envs
    that was a tenth of a 1-step collect (off-policy ``train_freq=1``). One PCG64 is reused
    and given each env's state as PCG64's seeding computes it from the same SeedSequence's
    pool (a ``uint32`` entropy array equals the list when every word is below 2**32; else,
    or on a big-endian machine, ``default_rng`` itself runs).

    >>> a, b = np.zeros((3, 2, 4), np.float32), np.zeros((3, 2, 4), np.float32)
    >>> fill_noise(a, 7, 5, 11)
    >>> for i in range(2):
    ...     b[:, i] = np.random.default_rng([7, 5 + i, 11]).random((3, 4), dtype=np.float32)
    >>> np.array_equal(a, b)
    True
    """
    rows, n, k = noise.shape
    if not (0 <= seed < _U32 and 0 <= first_env and first_env + n <= _U32 and 0 <= steps_done < _U32) \
            or sys.byteorder != "little":
        for i in range(n):
            rng = np.random.default_rng([seed, first_env + i, steps_done])
            noise[:, i, :] = rng.random((rows, k), dtype=np.float32)
        return
    bits = np.random.PCG64(0)
    gen = np.random.Generator(bits)
    entropy = np.array([seed, 0, steps_done], dtype=np.uint32)
    state = {"bit_generator": "PCG64", "state": {"state": 0, "inc": 0}, "has_uint32": 0, "uinteger": 0}
    words = state["state"]
    for i in range(n):
        entropy[1] = first_env + i
        pool = np.random.SeedSequence(entropy).pool.tolist()
        w = []  # SeedSequence.generate_state(8): each pool word hashed with its constants
        for j, (before, after) in enumerate(_STATE_CONSTS):
            x = ((pool[j & 3] ^ before) * after) & _M32
            w.append(x ^ (x >> 16))
        # generate_state(4, uint64) pairs words little-endian; PCG64 seeds with
        # initstate = s[0] << 64 | s[1], initseq = s[2] << 64 | s[3] (pcg64_set_seed):
        # state 0, inc = initseq << 1 | 1, step, add initstate, step
        initstate = (w[0] | w[1] << 32) << 64 | w[2] | w[3] << 32
        inc = (((w[4] | w[5] << 32) << 64 | w[6] | w[7] << 32) << 1 | 1) & _M128
        words["state"] = ((inc + initstate) * _PCG_MULT + inc) & _M128
        words["inc"] = inc
        bits.state = state
        noise[:, i, :] = gen.random((rows, k), dtype=np.float32)
