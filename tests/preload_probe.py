"""An env class whose module records which process imported it (for tests/test_env_preload.py;
not a test module: the env forkserver imports it, pytest must not collect it)."""
import os

from auturi.envs import CountingEnv

IMPORTED_IN = os.getpid()


class PreloadProbeEnv(CountingEnv):
    """At each step writes ``<directory>/<pid>``: ``1`` if this module was imported by the
    process stepping it, ``0`` if it came with the process (imported by the server it forked from)."""

    def __init__(self, directory: str):
        super().__init__()
        self.directory = directory

    def step(self, action):
        with open(os.path.join(self.directory, str(os.getpid())), "w") as f:
            f.write("1" if IMPORTED_IN == os.getpid() else "0")
        return super().step(action)


SEEN: list[bool] = []
"""What :class:`ServerWatch` saw, call by call, in this process."""


class ServerWatch:
    """An env factory that notes, each time it makes an env in this process, whether the env
    workers' forkserver for its own modules had been started already."""

    def __call__(self):
        from auturi.executor.shm import forkservers

        # The server's key also holds the id providers this process has imported (ale_py
        # after an Atari test): any env server preloading this module counts.
        SEEN.append(any(key[:len(forkservers.ENV_PRELOAD)] == tuple(forkservers.ENV_PRELOAD)
                        and "tests.preload_probe" in key and getattr(server, "_forkserver_pid", None) is not None
                        for key, server in list(forkservers._servers.items())))
        return CountingEnv()
