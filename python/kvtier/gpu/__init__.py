"""Worker-side transfers between a GPU (or CPU) KV cache and block files."""

from kvtier.gpu.transfer import GPUStorageTransfer, cuda_available

__all__ = ["GPUStorageTransfer", "cuda_available"]
