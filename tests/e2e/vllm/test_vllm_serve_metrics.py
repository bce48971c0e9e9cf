"""kvtier's metrics in vLLM's Prometheus output, scraped from a running ``vllm serve``.

The server is what operators run: vLLM's OpenAI-compatible server on 127.0.0.1, kvtier as
the secondary tier of its OffloadingConnector (with the test-only CPU spec), /metrics scraped
over HTTP after a completion stored the prompt's prefix in kvtier.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_runner import (
    ENGINE_ENV,
    HAVE_VLLM,
    HERE,
    PREFIX_CHUNKS,
    SKIP_REASON,
    kvtier_config,
)

if not HAVE_VLLM:
    pytest.skip(SKIP_REASON, allow_module_level=True)


START_TIMEOUT_S = 180.0  # the server's start-up box


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: dict | None = None, timeout: float = 60.0) -> str:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def samples(text: str, name: str) -> dict[str, float]:
    """Prometheus text format: {labels: value} of the samples named ``name``."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) :].rpartition(" ")
            out[labels] = float(value)
    return out


@pytest.fixture
def server(model_dir: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "root"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update({k: v for k, v in ENGINE_ENV.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"})
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    command = [
        str(Path(sys.executable).parent / "vllm"),
        "serve",
        str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enforce-eager",
        "--max-model-len", "2048",
        "--dtype", "bfloat16",
        "--kv-transfer-config", json.dumps(kvtier_config(root)),
    ]  # fmt: skip
    regions_before = set(Path("/dev/shm").glob("vllm_offload_*"))
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited ({process.returncode}):\n{log.read_text()[-4000:]}")
            try:
                http(base + "/health", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not start in {START_TIMEOUT_S:.0f}s:\n"
                            f"{log.read_text()[-4000:]}")  # fmt: skip
            time.sleep(1)
        yield base, root
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # The primary tier's shared memory goes with the server, however it was stopped.
    assert set(Path("/dev/shm").glob("vllm_offload_*")) <= regions_before


def test_kvtier_metrics_in_vllm_serve_prometheus_output(
    server: tuple[str, Path], model_dir: Path, prompts: list[list[int]]
) -> None:
    base, root = server
    completion = {"model": str(model_dir), "max_tokens": 2, "temperature": 0.0}
    http(base + "/v1/completions", {**completion, "prompt": prompts[0]})

    def scrape() -> dict[str, float] | None:
        # vLLM collects the tier's stats once per engine step: a tiny request makes a step.
        http(base + "/v1/completions", {**completion, "prompt": [5, 6, 7]})
        text = http(base + "/metrics")
        used = samples(text, "vllm:kvtier_used_bytes")
        written = samples(text, "vllm:kv_offload_tiering_write_bytes_total")
        kvtier_written = [v for k, v in written.items() if "KvtierFileSystemTier" in k]
        # The block files are renamed in (and counted as used) before vLLM collects the
        # finished store; its written bytes show from the engine step that collected it.
        done = (
            len(list(root.rglob("*.kvb"))) == PREFIX_CHUNKS
            and any(used.values())
            and any(kvtier_written)
        )
        return used if done else None

    deadline = time.monotonic() + 120
    while (used := scrape()) is None:
        if time.monotonic() > deadline:
            pytest.fail("kvtier's used bytes, or vLLM's bytes written to kvtier, never showed")
        time.sleep(1)
    on_disk = sum(p.stat().st_size for p in root.rglob("*.kvb"))
    [(labels, value)] = used.items()
    assert f'root_dir="{root}"' in labels
    assert value >= on_disk  # the block files, and any budget this instance has leased ahead
