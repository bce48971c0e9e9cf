"""Secondary tiers for KV-cache offloading: the contract, the factory and the built-in tiers.

Tier implementations (``example``, ``fs``) are imported lazily by the factory, not here.
"""

from kvtier.tiering.base import (
    JobId,
    JobMetadata,
    JobResult,
    OffloadKey,
    ReqContext,
    SecondaryTierManager,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

__all__ = [
    "JobId",
    "JobMetadata",
    "JobResult",
    "OffloadKey",
    "OffloadingSpec",
    "ReqContext",
    "SecondaryTierFactory",
    "SecondaryTierManager",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
]
