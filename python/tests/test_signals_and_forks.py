"""What the process around a pipeline does to it: a fork (os.fork, multiprocessing's "fork"
start method, as DataLoader workers use) gets a clear error at once instead of a hang, and
Ctrl-C raises KeyboardInterrupt within 100 ms while a batch is awaited."""

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import gpufeed
from conftest import ASSETS


def wait_for_child(pid, seconds):
    """The child's exit status, or a failure (after killing it) if it runs longer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child still ran after {seconds} s")


@pytest.mark.parametrize("taken", [0, 1])
def test_a_forked_child_gets_an_error_within_a_second(taken):
    pipe = gpufeed.Pipeline(ASSETS, batch_size=2, device="cpu")
    for _ in range(taken):
        next(iter(pipe))
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 1
        try:
            start = time.monotonic()
            try:
                next(iter(pipe))
            except gpufeed.GpufeedError as e:
                ok = "fork" in str(e) and "build the pipeline" in str(e)
                code = 0 if ok and time.monotonic() - start < 1.0 else 2
            for what in (lambda: len(pipe), lambda: pipe.epoch_report(), pipe.next_epoch):
                try:
                    what()
                    code = 3
                except gpufeed.GpufeedError:
                    pass
        finally:
            os._exit(code)
    assert wait_for_child(pid, 20) == 0
    # The parent's pipeline is untouched.
    assert sum(len(b) for b in pipe) > 0


def _use_inherited(pipe, queue):
    try:
        next(iter(pipe))
        queue.put("no error")
    except gpufeed.GpufeedError as e:
        queue.put(str(e))


def _build_in_child(queue):
    pipe = gpufeed.Pipeline(ASSETS, batch_size=3, device="cpu")
    queue.put(sum(len(b) for b in pipe))


def test_multiprocessing_fork_children_error_or_build_their_own():
    context = multiprocessing.get_context("fork")
    pipe = gpufeed.Pipeline(ASSETS, batch_size=2, device="cpu")
    queue = context.Queue()
    for target, args in [(_use_inherited, (pipe, queue)), (_build_in_child, (queue,))]:
        child = context.Process(target=target, args=args)
        child.start()
        child.join(30)
        if child.is_alive():
            child.kill()
            pytest.fail(f"{target.__name__} still ran after 30 s")
    inherited, built = queue.get(timeout=5), queue.get(timeout=5)
    assert "fork" in inherited, inherited
    assert built == pipe.num_images == len(list(ASSETS.glob("*.*"))) - 1


def slow_folder(folder, copies=300):
    """Hard links to one large PPM: an epoch takes seconds on one thread."""
    folder.mkdir()
    pixels = np.random.default_rng(1).integers(0, 256, (2000, 2000, 3), dtype=np.uint8)
    first = folder / "big_000.ppm"
    first.write_bytes(b"P6\n2000 2000\n255\n" + pixels.tobytes())
    for i in range(1, copies):
        os.link(first, folder / f"big_{i:03}.ppm")
    return folder


def test_ctrl_c_interrupts_a_wait_for_a_batch_within_100_ms(tmp_path):
    folder = slow_folder(tmp_path / "slow")
    script = textwrap.dedent(
        f"""
        import sys, time, gpufeed
        pipe = gpufeed.Pipeline({str(folder)!r}, batch_size=256, threads=1, device="cpu")
        print("ready", flush=True)
        try:
            for batch in pipe:
                print("batch", flush=True)
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), flush=True)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        # Well inside the wait for the first batch: 256 large images on one thread take a second
        # or more (64 of them came within 0.5 s on a fast machine).
        time.sleep(0.5)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().split()
        assert line and line[0] == "interrupted", (line, child.stderr.read())
        assert float(line[1]) - sent < 0.1, f"KeyboardInterrupt {float(line[1]) - sent:.3f} s late"
    finally:
        child.kill()
        child.wait()


def test_ctrl_c_interrupts_a_url_source_that_never_answers_within_100_ms():
    """A server that accepts connections and never answers: the listing waits, and Ctrl-C ends
    it within 100 ms with KeyboardInterrupt."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    port = server.getsockname()[1]
    script = textwrap.dedent(
        """
        import sys, time, gpufeed
        print("ready", flush=True)
        try:
            gpufeed.Pipeline("s3://bucket/train/", device="cpu")
            print("opened", flush=True)
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), flush=True)
        """
    )
    env = dict(
        os.environ,
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="key",
        AWS_SECRET_ACCESS_KEY="secret",
        AWS_REGION="us-east-1",
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        # Wait for the listing's request: a connection accepted, never answered.
        server.settimeout(30)
        connection, _ = server.accept()
        time.sleep(0.3)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().split()
        assert line and line[0] == "interrupted", (line, child.stderr.read())
        assert float(line[1]) - sent < 0.1, f"KeyboardInterrupt {float(line[1]) - sent:.3f} s late"
        connection.close()
    finally:
        child.kill()
        child.wait()
        server.close()
