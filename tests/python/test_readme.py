"""The README is a contract too: its commands and examples must be the ones that work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _text() -> str:
    return README.read_text()


def test_ci_marker_matches_the_visible_test_command():
    text = _text()
    marker = re.search(r"<!-- test-command: (.*) -->", text)
    assert marker, "README.md lacks the test-command marker that .ci/run executes"
    shell_blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    assert marker.group(1).strip() in [b.strip() for b in shell_blocks]


def test_fs_tier_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", _text(), re.S)
    example = next(b for b in blocks if "create_secondary_tier" in b)
    assert "/mnt/nvme/kvcache" in example
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    code = compile(example.replace("/mnt/nvme/kvcache", str(tmp_path / "kv")), "README", "exec")
    exec(code, scope)
    assert list((tmp_path / "kv").rglob("*.kvb")), "the example stored no block file"
    # Its equality check proves the load: the block holds distinct values, not a constant
    # that every slot shares anyway.
    block = scope["primary"][42]
    assert len(set(block.reshape(-1).tolist())) > 100
    assert not (scope["primary"][41] == block).all()


def test_gpu_example_runs(tmp_path, monkeypatch):
    # The example picks its device itself: CUDA tensors where torch has a GPU, else CPU
    # tensors, which GPUStorageTransfer moves through the same code (host copies instead of
    # CUDA copies). So on a machine without CUDA this runs the example's text unchanged on
    # the CPU; only the root directory is redirected.
    torch = pytest.importorskip("torch", reason="the GPU example needs torch")
    blocks = re.findall(r"```python\n(.*?)```", _text(), re.S)
    example = next(b for b in blocks if "GPUStorageTransfer(" in b)
    assert "/mnt/nvme/kvcache" in example
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(
        compile(example.replace("/mnt/nvme/kvcache", str(tmp_path / "kv")), "README", "exec"), scope
    )
    assert scope["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert len(list((tmp_path / "kv").rglob("*.kvb"))) == 4, "the example stored no block files"
