"""``auturi.device_wait``: a forward pass's results come back from a CUDA device while the
waiting thread sleeps, not spins (its module docstring says why collection needs that)."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from auturi.device_wait import to_host, wait_for_device


def test_to_host_on_the_cpu_is_cpu_numpy():
    a, b = torch.arange(6).reshape(2, 3), torch.tensor([0.25, -1.0])
    out = to_host(a, b)
    assert [x.dtype for x in out] == [np.int64, np.float32]
    np.testing.assert_array_equal(out[0], a.numpy())
    np.testing.assert_array_equal(out[1], b.numpy())
    wait_for_device(torch.device("cpu"))  # nothing to wait for: returns


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_waiting_for_a_long_pass_leaves_the_core_free():
    x = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    for _ in range(3):  # warm: kernels loaded, clocks up
        (x @ x).sum().item()
    # Queue about half a second of device work (calibrated here, since GPUs differ).
    t0 = time.perf_counter()
    y = x
    for _ in range(10):
        y = (y @ x) / 64.0
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 10
    reps = max(10, int(0.5 / max(per, 1e-6)))
    y = x
    for _ in range(reps):
        y = (y @ x) / 64.0
    c0, w0 = time.process_time(), time.perf_counter()
    (host,) = to_host(y.sum())
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    assert np.isfinite(host)
    assert wall > 0.1, "the queued work ended before the wait: the test measured nothing"
    assert cpu < 0.5 * wall, f"the wait held a core: {cpu:.3f} s of CPU in {wall:.3f} s"
