"""The Python package on a CUDA device, consumed by PyTorch: the same bits as the CPU device, a
consumer on a side stream that reads each batch late, and memory over many epochs. Skipped
without torch and a GPU (failing instead under GPUFEED_REQUIRE_GPU=1)."""

import gc

import numpy as np
import pytest

import gpufeed
from conftest import ASSETS, all_images, cuda_torch


def cpu_reference(**kw):
    """One epoch on the CPU device, as float32 torch tensors per batch (bits kept via views)."""
    torch = cuda_torch()
    pipe = gpufeed.Pipeline(paths=all_images(), device="cpu", **kw)
    return [(b.ids, torch.from_dlpack(b.images).clone()) for b in pipe]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_cuda_batches_equal_the_cpu_device_bit_for_bit(dtype, layout):
    torch = cuda_torch()
    kw = dict(batch_size=5, dtype=dtype, layout=layout)
    want = cpu_reference(**kw)
    pipe = gpufeed.Pipeline(paths=all_images(), device="cuda:0", **kw)
    got = []
    for batch in pipe:
        x = torch.from_dlpack(batch.images)
        assert x.is_cuda and x.device.index == 0 and x.is_contiguous()
        got.append((batch.ids, x.cpu()))
    assert len(got) == len(want)
    for (gids, g), (wids, w) in zip(got, want):
        assert gids == wids
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.view(torch.int16 if g.element_size() == 2 else torch.int32),
                           w.view(torch.int16 if w.element_size() == 2 else torch.int32))


@pytest.mark.parametrize("consumer", ["side stream", "default stream"])
def test_a_slow_torch_consumer_never_sees_the_next_batch(consumer):
    torch = cuda_torch()
    kw = dict(batch_size=3, dtype="float16")
    want = cpu_reference(**kw)
    side = torch.cuda.Stream() if consumer == "side stream" else torch.cuda.default_stream()
    pipe = gpufeed.Pipeline(paths=all_images(), device="cuda:0", prefetch=3, **kw)
    copies = []
    with torch.cuda.stream(side):
        for batch in pipe:
            x = torch.from_dlpack(batch.images)  # `side` waits for the batch
            torch.cuda._sleep(40_000_000)  # ~20 ms: the pipeline writes the next batches meanwhile
            copies.append(x.clone())  # reads the batch after the sleep, on `side`
            del x, batch  # freed at once; the memory must wait for `side`
    side.synchronize()
    assert len(copies) == len(want)
    for i, (c, (_, w)) in enumerate(zip(copies, want)):
        assert torch.equal(c.cpu().view(torch.int16), w.view(torch.int16)), f"batch {i} was overwritten"


def test_tensors_outlive_their_batch_and_pipeline():
    torch = cuda_torch()
    pipe = gpufeed.Pipeline(ASSETS, batch_size=4, device="cuda:0", dtype="float32")
    x = torch.from_dlpack(pipe.next_batch().images)
    want = x.cpu().clone()
    del pipe
    gc.collect()
    for _ in gpufeed.Pipeline(ASSETS, batch_size=4, device="cuda:0", dtype="float32"):
        pass
    assert torch.equal(x.cpu(), want)


class Capsule:
    """Hands a ready capsule to a consumer that asks through `__dlpack__`."""

    def __init__(self, capsule, device):
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        return self.device


def test_dlpack_host_copy_and_streams():
    torch = cuda_torch()
    batch = gpufeed.Pipeline(ASSETS, batch_size=2, device="cuda:0", dtype="float32").next_batch()
    t = batch.images
    assert t.__dlpack_device__() == (2, 0) and t.device == "cuda:0" and t.cuda_stream
    copy = t.__dlpack__(dl_device=(1, 0), max_version=(1, 0))  # a host copy
    host = np.from_dlpack(Capsule(copy, (1, 0)))
    assert np.array_equal(host, torch.from_dlpack(t).cpu().numpy())
    with pytest.raises(BufferError):
        t.__dlpack__(stream=0)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(1, 0), copy=False)
    s = torch.cuda.Stream()
    for stream in (None, 1, 2, -1, s.cuda_stream):
        y = torch.from_dlpack(t.__dlpack__(stream=stream))  # a legacy capsule, taken as it is
        torch.cuda.synchronize()
        assert torch.equal(y.cpu(), torch.from_dlpack(t).cpu())


def test_device_and_host_memory_stay_flat_over_many_epochs():
    torch = cuda_torch()

    def rss():
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmRSS:"))

    pipe = gpufeed.Pipeline(paths=all_images(), batch_size=8, device="cuda:0", prefetch=2)
    side = torch.cuda.Stream()

    def epoch():
        with torch.cuda.stream(side):
            for batch in pipe:
                torch.from_dlpack(batch.images).float().mean()
        side.synchronize()

    for _ in range(3):
        epoch()
    free_before, _ = torch.cuda.mem_get_info()
    rss_before = rss()
    for _ in range(40):
        epoch()
    free_after, _ = torch.cuda.mem_get_info()
    device_growth = free_before - free_after
    host_growth = rss() - rss_before
    print(f"40 epochs: device memory {device_growth / 2**20:+.1f} MiB, host {host_growth / 2**20:+.1f} MiB")
    assert device_growth < 64 * 2**20
    assert host_growth < 32 * 2**20
