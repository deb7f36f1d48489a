"""Tools for Auturi's tests and benchmarks, never for training: nothing in ``auturi``'s normal
paths imports this package (``import auturi`` and ``import auturi.envs`` leave it unimported;
``tests/test_emulated_gpu.py`` checks).

- :mod:`auturi.testing.emulated_sim`: envs that emulate a simulator running on other cores
  (their steps wait, with a seeded spread of step times), named step-time profiles, and
  :class:`~auturi.testing.emulated_sim.SimCores`, a pool of emulated simulator cores.
- :mod:`auturi.testing.emulated_gpu`: an emulated inference device (a policy whose forward
  pass waits, with a per-process start cost like CUDA's context) and
  :func:`~auturi.testing.emulated_gpu.emulated_gpu`, the context manager under which this
  process counts emulated CUDA devices.

Together they emulate, on a 2-core machine without a GPU, the regime of a 16-core machine with
one GPU (``bench/emulated_gpu.py``).
"""
