"""The vLLM peer: the same workload through vLLM's own `fs` secondary tier.

Imported only for ``--peer vllm``. vLLM's tier does its block I/O in a native extension
(``vllm.fs_io_C``) when that loads, else in pure Python on its own thread pool; which one ran
is part of the result, because the two differ a lot in CPU cost and GIL pressure.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvtier.bench.errors import BenchError
from kvtier.bench.workload import (
    FADVISE,
    O_DIRECT,
    DriverFactory,
    Finished,
    Job,
    PrimaryMemory,
    TierDriver,
)

SUPPORTED = "vLLM 0.33"


def vllm_status() -> dict:
    """Whether vLLM's `fs` tier can run here: {"available", "version", "io_path", "reason"}."""
    try:
        import vllm
        from vllm.v1.kv_offload.tiering.fs import io as fs_io
        from vllm.v1.kv_offload.tiering.fs import manager as _manager  # noqa: F401
    except Exception as exc:  # ImportError, or vLLM failing inside its own import
        return {
            "available": False,
            "reason": (
                f"vLLM is not importable in this Python ({type(exc).__name__}: {exc}); build "
                "an environment with `bash .ci/vllm-native-env.sh` (vLLM's native I/O path) "
                "and run `.venv-vllm-native/bin/python -m kvtier bench --peer vllm`"
            ),
        }
    version = getattr(vllm, "__version__", "unknown")
    # vLLM's fs tier picks its path once, when vllm...fs.io is imported: _HAS_FSIO_C says
    # whether its batch_store_block / batch_load_block call into vllm.fs_io_C.
    if getattr(fs_io, "_HAS_FSIO_C", False):
        import vllm.fs_io_C as native

        return {
            "available": True,
            "version": version,
            "io_path": "native (vllm.fs_io_C)",
            "io_path_kind": "native",
            "fs_io_C": getattr(native, "__file__", None),
        }
    try:
        import vllm.fs_io_C  # noqa: F401

        why = "it loads now, but vLLM's fs tier was imported before it could"
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
    return {
        "available": True,
        "version": version,
        "io_path": f"pure Python (vllm.fs_io_C could not load: {why})",
        "io_path_kind": "python",
        "native_unavailable": why,
    }


def _offloading_spec(block_size: int):
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    class _BenchSpec(OffloadingSpec):
        """Only what the `fs` tier reads; the engine-side hooks are never called here."""

        def get_manager(self):  # pragma: no cover - never called by a secondary tier
            raise NotImplementedError

        def get_worker(self, kv_caches):  # pragma: no cover
            raise NotImplementedError

    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
        worker_kv_bytes_per_block=block_size,
        enable_kv_cache_events=False,
        extra_config={},
        engine_id="kvtier-bench",
        model=OffloadingModelConfig(name="kvtier-bench", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )
    return _BenchSpec(config)


class VllmDriver:
    """vLLM's `fs` tier, created through vLLM's own SecondaryTierFactory."""

    name = "vllm"

    def __init__(
        self, root: Path, primary: PrimaryMemory, *, read_threads: int, write_threads: int
    ):
        from vllm.v1.kv_offload.base import ReqContext
        from vllm.v1.kv_offload.tiering.base import TransferJob
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

        self._transfer_job = TransferJob
        self._req = ReqContext(req_id="kvtier-bench")
        config = {
            "type": "fs",
            "root_dir": str(root),
            "n_read_threads": read_threads,
            "n_write_threads": write_threads,
        }
        try:
            self._tier = SecondaryTierFactory.create_secondary_tier(
                config, primary.view, _offloading_spec(primary.block_size)
            )
        except (OSError, ValueError) as exc:
            raise BenchError(f"cannot create vLLM's fs tier at {root}: {exc}") from exc
        self.cache_bypass = O_DIRECT if getattr(self._tier, "_use_o_direct", False) else FADVISE

    def _job(self, job: Job, is_promotion: bool):
        return self._transfer_job(
            job_id=job.job_id,
            keys=list(job.keys),
            chunk_ids=np.asarray(job.block_ids, dtype=np.int64),
            is_promotion=is_promotion,
            req_context=self._req,
        )

    def submit_store(self, job: Job) -> None:
        self._tier.submit_store(self._job(job, False))

    def submit_load(self, job: Job) -> None:
        self._tier.submit_load(self._job(job, True))

    def finished(self) -> list[Finished]:
        # vLLM's results carry no error text; its pool logs "Job %s block I/O failed: %s".
        return [Finished(r.job_id, bool(r.success), None) for r in self._tier.get_finished_jobs()]

    def file_paths(self, keys: Sequence[bytes]) -> list[str]:
        get = self._tier.file_mapper.get_file_name
        return [os.fspath(get(k)) for k in keys]

    def close(self) -> None:
        self._tier.shutdown()


def vllm_factory(read_threads: int, write_threads: int) -> DriverFactory:
    def create(root: Path, primary: PrimaryMemory) -> TierDriver:
        return VllmDriver(root, primary, read_threads=read_threads, write_threads=write_threads)

    return create
