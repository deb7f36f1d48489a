"""One actor's overlapped loop, simulated: how long a row takes when batches go out as the
executor's loop sends them (:meth:`~auturi.executor.actor_loop.ActorLoop._overlapped`).

Why a simulation: in the overlapped loop a batch goes once ``B`` envs are ready, whichever
they are, the envs furthest behind first; an env whose step straggles misses a batch and
rides in a later one, and the collect ends when its last env has stepped ``num_steps``
times. Closed forms for that either charge every batch the slowest of its lanes (the model
of 2026-11-26 afternoon: 27-30% low on the emulated straggler box) or none of them (the
wait for a batch to fill alone: 20-57% high there). Stepping the loop's own rules over step
times drawn from the profile, the model came within -14% to +25% of the emulated GPU box's 30
overlapped measurements of 2026-11-26 (``bench/results/model_check_evening*.json``).

What it simulates, per actor (actors run side by side; the cores and the device they share
are the model's business, :mod:`auturi.tuner.model`):

- ``E`` envs over ``D`` env lanes of ``E // D`` envs; lane 0 is the actor's own share, the
  others env workers that step what they are posted in order, one after another;
- the actor, one process whose clock runs on: each post to an env worker and each batch
  handed to a policy (a replica, or its own) costs it ``post``; with one replica (``P == 1``) the forward pass runs
  in it and blocks it ``L``; its own share steps in its loop when no batch is due, or, when
  ``own_threaded``, on a thread of its own (a lane without round trips);
- ``P > 1`` replicas, each a process running one pass of ``L`` at a time;
- a round trip of ``ipc`` per hand-off (half each way), and ``lane_cpu`` of an env worker's
  time per post.

It leaves out the cores: a process here runs when it has work. The model divides by
time-slicing and caps by the cores around it.

Example: two batches of 8 from 16 envs on 16 lanes; an env's cycle is its step, the wait
for its batch to fill, the pass and the round trips:

    >>> import numpy as np
    >>> steps = np.full((16, 8), 1e-3)
    >>> row = overlapped_row(16, 16, 2, 8, steps, latency=1e-3, ipc=0.0, post=0.0, lane_cpu=0.0)
    >>> round(row * 1e3, 3)
    2.0
"""
from __future__ import annotations

import heapq

import numpy as np


def overlapped_row(E: int, D: int, P: int, B: int, steps: np.ndarray, latency: float, ipc: float, post: float,
                   lane_cpu: float, own_threaded: bool = True) -> float:
    """Seconds a row takes (a collect of ``steps.shape[1]`` steps of each env, divided by
    that): ``steps[i, k]`` is env ``i``'s ``k``-th step's seconds. See the module docstring."""
    S = steps.shape[1]
    m = max(1, E // D)
    step = steps.tolist()
    lane_of = [min(i // m, D - 1) for i in range(E)]
    t = [0] * E
    ready = list(range(E))  # arrival order
    lane_free = [0.0] * D
    rep_free = [0.0] * max(1, P)
    free = list(range(P))[::-1] if P > 1 else []
    events: list[tuple[float, int, int, list[int]]] = []  # (time, seq, kind, envs): 0 stepped, 1 acted
    seq = 0
    own: list[int] = []  # acted envs of the own share, stepped in the loop
    now = 0.0
    in_env = finished = 0
    half = 0.5 * ipc
    deferred = submitted = 0

    def route(batch: list[int]) -> None:
        nonlocal now, seq, in_env
        in_env += len(batch)
        by_lane: dict[int, list[int]] = {}
        for i in batch:
            by_lane.setdefault(lane_of[i], []).append(i)
        for lane, envs in by_lane.items():
            if lane == 0:
                if not own_threaded:
                    own.extend(envs)
                    continue
                end = max(now, lane_free[0])
                for i in envs:
                    end += step[i][t[i]]
                lane_free[0] = end
                seq += 1
                heapq.heappush(events, (end, seq, 0, envs))
                continue
            now += post
            end = max(now + half, lane_free[lane]) + lane_cpu
            for i in envs:
                end += step[i][t[i]]
            lane_free[lane] = end
            seq += 1
            heapq.heappush(events, (end + half, seq, 0, envs))

    def stepped(envs: list[int]) -> None:
        nonlocal in_env, finished
        in_env -= len(envs)
        for i in envs:
            t[i] += 1
            if t[i] < S:
                ready.append(i)
            else:
                finished += 1

    quota = -(-m * B // E)  # a batch takes this many envs of each lane while others have some

    def take() -> list[int]:
        ready.sort(key=t.__getitem__)  # stable: the furthest behind first, first come among equals
        if len(ready) <= B or quota >= m:
            batch = ready[:B]
            del ready[:B]
            return batch
        # spread over the lanes (spread_batch): at most ``quota`` of each, then topped up in order
        taken: dict[int, int] = {}
        pick, rest = [], []
        for i in ready:
            if len(pick) < B and taken.get(lane_of[i], 0) < quota:
                taken[lane_of[i]] = taken.get(lane_of[i], 0) + 1
                pick.append(i)
            else:
                rest.append(i)
        if len(pick) < B:
            k = B - len(pick)
            pick.extend(rest[:k])
            rest = rest[k:]
        ready[:] = rest
        return pick

    while finished < E:
        # Full batches, or a short one once the envs stepping now could not fill it.
        while ready and (P == 1 or free) and (len(ready) >= B or len(ready) + in_env < B):
            batch = take()
            submitted += 1
            if P == 1:
                now += post + latency
                route(batch)
            else:
                r = free.pop()
                now += post
                done = max(now + half, rep_free[r]) + latency
                rep_free[r] = done
                seq += 1
                heapq.heappush(events, (done + half, seq, 1, batch + [r]))
        if events and events[0][0] <= now:  # what the lanes reported meanwhile
            while events and events[0][0] <= now:
                _, _, kind, envs = heapq.heappop(events)
                if kind == 1:
                    free.append(envs.pop())
                    route(envs)
                else:
                    stepped(envs)
            continue
        if own:
            # The loop's rule (``batch_due``): while the envs stepping now would fill a batch,
            # await it rather than step the own share, but for one batch at most.
            coming = sum(len(e) for _, _, k, e in events if k == 0)
            if (deferred and deferred != submitted + 1) or not (P == 1 or free) or not coming:
                deferred, due = 0, False
            elif len(ready) + coming < B:
                due = False
            else:
                deferred, due = submitted + 1, True
            if not due:
                part = own[:B]
                del own[:B]
                for i in part:
                    now += step[i][t[i]]
                stepped(part)
                continue
        if not events:
            raise RuntimeError("overlapped_row: nothing in flight and no batch due (a bug)")
        tm = events[0][0]
        now = max(now, tm)
    return now / S
