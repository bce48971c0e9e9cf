"""TEST-ONLY: vLLM's TieringOffloadingSpec on the CPU platform, for the engine tests.

Stock vLLM 0.33 refuses KV offloading on its CPU platform: ``CPUOffloadingSpec.get_worker``
raises unless the platform is CUDA-alike or XPU, and its transfer handlers copy with CUDA
streams and events. On a GPU none of this file exists: vLLM's own worker copies GPU blocks
to the CPU primary tier and back on CUDA streams. Here the "GPU" KV cache is host memory and
the CPU forward pass is synchronous, so this worker copies the same bytes between the same
two places (the engine's KV-cache blocks and the primary tier's shared-memory rows, both from
vLLM) with plain tensor copies that are finished when ``submit_*`` returns.

Everything else is vLLM's own code: scheduler, connector, CPU primary tier, the secondary
tiers (kvtier's among them), lookups and promotions. Loaded by the engine through
``"spec_name": "CpuTestTieringOffloadingSpec", "spec_module_path": "cpu_offloading_spec"``.
Direct (worker-private) layout only; the canonical layout is refused.
"""

from __future__ import annotations

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingManager,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


class _HostCopyWorker(OffloadingWorker):
    """Moves whole block pages between the engine's KV cache and primary-tier rows."""

    def __init__(
        self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, region: SharedOffloadRegion
    ):
        self._region = region
        self._bpc = blocks_per_chunk
        self._engine: list[torch.Tensor] = []  # per tensor: (num_blocks, page) int8
        self._rows: list[torch.Tensor] = []  # per tensor: (num_chunks, blocks_per_chunk, page)
        for kv in kv_caches.tensors:
            page = kv.page_size_bytes
            self._engine.append(kv.tensor.view(torch.int8).view(-1, page))
            rows = region.create_next_worker_view(page * blocks_per_chunk)
            self._rows.append(rows.unflatten(1, (blocks_per_chunk, page)))
        self._done: list[TransferResult] = []

    def _sub_blocks(self, engine_spec: GPULoadStoreSpec, chunks: LoadStoreSpec):
        """(engine blocks, chunk rows, positions in the row) of one transfer, all groups.

        A group's blocks are logically contiguous from block_indices[g]; its first chunk may
        be entered part-way, at block_indices[g] % blocks_per_chunk."""
        blocks, rows, subs = [], [], []
        chunk_ids = chunks.block_ids.tolist()  # type: ignore[attr-defined]
        ids = engine_spec.block_ids.tolist()
        start = chunk_start = 0
        for size, first in zip(engine_spec.group_sizes, engine_spec.block_indices):
            skip = first % self._bpc
            for i in range(size):
                rows.append(chunk_ids[chunk_start + (skip + i) // self._bpc])
                subs.append((skip + i) % self._bpc)
            blocks += ids[start : start + size]
            start += size
            chunk_start += -(-(skip + size) // self._bpc) if size else 0
        return torch.tensor(blocks), torch.tensor(rows), torch.tensor(subs)

    def _copy(
        self, job_id: int, engine_spec: GPULoadStoreSpec, chunks: LoadStoreSpec, store: bool
    ) -> bool:
        blocks, rows, subs = self._sub_blocks(engine_spec, chunks)
        size = 0
        for engine, cpu in zip(self._engine, self._rows):
            if store:
                cpu[rows, subs] = engine[blocks]
            else:
                engine[blocks] = cpu[rows, subs]
            size += len(blocks) * engine.shape[1]
        self._done.append(TransferResult(job_id=job_id, success=True, transfer_size=size))
        return True

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        return self._copy(job_id, src_spec, dst_spec, store=True)

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        expedited: bool = False,
    ) -> bool:
        return self._copy(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        pass  # every copy finished inside submit_*

    def shutdown(self) -> None:
        self._engine.clear()
        self._rows.clear()
        self._region.cleanup()


# The scheduler-side managers this process built, so a test can ask kvtier's tier (one of
# their secondary_tiers) for its counters.
MANAGERS: list[OffloadingManager] = []


class CpuTestTieringOffloadingSpec(TieringOffloadingSpec):
    """TieringOffloadingSpec whose worker copies on the host (see the module docstring)."""

    def get_manager(self) -> OffloadingManager:
        if not self._manager:
            MANAGERS.append(super().get_manager())
            _unlink_if_second(self._scheduler_mmap)
        return super().get_manager()

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self.config.canonical_layout:
            raise ValueError("the CPU test spec supports the direct layout only")
        if not self._worker:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(
                engine_id=self._engine_id,
                num_chunks=self.num_chunks,
                rank=rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            _unlink_if_second(region)
            self._worker = _HostCopyWorker(kv_caches, self.blocks_per_chunk, region)
        return self._worker


def _unlink_if_second(region: SharedOffloadRegion | None) -> None:
    """The worker and the scheduler's primary tier each map the region's file in /dev/shm;
    whichever maps it second (vLLM builds the worker first) removes its path. Both mappings
    stay valid and the memory goes with the engine, so no exit, a server stopped by a signal
    included, leaves the file behind. Removed any earlier, the second would create a region of
    its own and the two would no longer share the blocks (vLLM's barrier, which unlinks once
    every worker has mapped it, does not wait for the scheduler)."""
    if region is not None and not region._creator:  # vLLM 0.33: True for the one that made it
        region._unlink()
