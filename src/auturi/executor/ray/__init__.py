"""The ``ray`` backend: each actor of the config is a Ray actor, anywhere on a Ray cluster.

Layout for a config of ``A`` actors of ``E`` envs:

- Ray actor ``a`` (:class:`RayActorHost`) owns global envs ``a*E .. (a+1)*E - 1``. On its node
  it runs a local ``shm`` executor over them with the sub-config ``Config(1, E, degree,
  policies, batch, device)``: the same env workers, replicas, shared memory and actor loop as
  the ``shm`` backend (all in the Ray actor's process for a serial sub-config).
- It asks Ray for ``Config.processes_per_actor`` CPUs (and one GPU for a CUDA policy) in one
  bundle of a ``SPREAD`` placement group, so actors spread over the alive nodes and each
  actor's processes share one node (an actor never spans nodes). ``actor_nodes`` records
  where each actor landed.
- One remote call per actor per collect (never one per env step): ``collect(num_steps)``
  returns that actor's columnar :class:`~auturi.Rollout`; the caller copies it into its
  columns of the whole. Seeds, noise streams and final-observation keys use global env
  indices (``Executor.env_id_offset``), so the data equals the serial backend's bit for bit.
- Weights: ``set_policy_state`` puts the state in the object store once and hands the
  reference to every actor once per update.
- ``reconfigure``: when every actor keeps its envs and its bundle (e.g. a new
  ``policy_batch_size``), the Ray actors stay and each reconfigures its own ``shm`` executor
  in place (processes kept, envs moved live: episodes go on, the data stays the serial
  run's). Otherwise (other actor counts, processes per actor or device) it ends the Ray
  actors and starts new ones, with the next env generation (fresh seeds, new episodes):
  Ray cannot resize a placement-group bundle under a running actor. ``last_reconfigure``
  counts the Ray actors' own processes with the ones inside them.
- What each actor asks for and runs (bundle, node config, cores) is the layout plan's
  (:mod:`auturi.executor.layout`).

Connecting (``address``): ``None`` uses the Ray instance this process is already connected
to, else the cluster in ``RAY_ADDRESS``, else starts a local instance sized to this machine;
``"auto"``, ``"host:port"`` or ``"ray://..."`` connect to an existing cluster. A local instance
Auturi started is shut down when the last Ray executor using it closes; a cluster you
connected to, or a ``ray.init()`` you made yourself, is never shut down by Auturi.

Failure policy: nothing is restarted. A Ray actor that raises, dies (killed, out of memory,
its node lost) or loses a worker of its own, during a collect, a weight update or start-up,
surfaces as :class:`auturi.WorkerError` naming the actor, its envs, its node and the cause
(the remote traceback, or Ray's death cause), and the executor closes, as with ``shm``: no
partial rollout is returned, so no data is silently dropped. Every wait is a loop of short
``ray.wait`` calls that also checks the actors' nodes are alive, so nothing hangs on a lost
node; an actor whose node is lost fails with a reason naming the node and what to do (an
actor whose socket closed waits, bounded, for the GCS's verdict on its node first). An actor
dropped by Ray before it ran names the usual cause: this process and the cluster disagree on
token authentication (``RAY_AUTH_MODE``). ``close()`` (also on errors and Ctrl-C) asks idle actors to close their executors (which
ends their processes and unlinks their shared memory), then kills every Ray actor; a busy actor
is killed at once, and its processes end by themselves (each watches its parent) and its
segments are unlinked by its resource tracker.

Modules by role: ``cluster`` (resources, connection, lost nodes), ``actor`` (the Ray actor's
body), ``sweep`` (clean-up after dead actors), ``executor`` (:class:`RayExecutor`, with its
progress watch for ``worker_timeout``); this package re-exports their public names. Ray itself
is imported only when a function needs it (importing this package does not start Ray).
"""
from __future__ import annotations

from auturi.executor.ray.actor import RayActorHost, SliceExecutor, stack_of
from auturi.executor.ray.cluster import ClusterResources, connect, ray_cluster_resources, release
from auturi.executor.ray.executor import LIVENESS_SECONDS, POLL_SECONDS, PROBE_SECONDS, RayExecutor
from auturi.executor.ray.sweep import CLOSE_SECONDS, sweep_segments

__all__ = ["RayExecutor", "RayActorHost", "SliceExecutor", "ClusterResources", "ray_cluster_resources", "connect",
           "release", "sweep_segments", "stack_of", "POLL_SECONDS", "LIVENESS_SECONDS", "CLOSE_SECONDS",
           "PROBE_SECONDS"]
