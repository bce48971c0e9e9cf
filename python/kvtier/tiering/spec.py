"""What a tier needs to know about the model and the KV layout."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kvtier.errors import ConfigurationError


@dataclass(frozen=True)
class OffloadingSpec:
    """Model and layout facts a tier reads; engines' own spec objects are converted to this.

    Everything here that can change the bytes of a block (all fields but ``rank``) goes into
    the fs tier's namespace fingerprint, so blocks of different layouts never mix.
    """

    model_name: str
    dtype: str
    tokens_per_block: int = 16
    blocks_per_file: int = 1
    tp_size: int = 1
    pp_size: int = 1
    pcp_size: int = 1
    dcp_size: int = 1
    rank: int = 0
    kv_cache_groups: tuple[Any, ...] = ()
    kv_layout: str = ""

    def __post_init__(self) -> None:
        for name in ("model_name", "dtype", "kv_layout"):
            value = getattr(self, name)
            if not isinstance(value, str):
                # ConfigurationError (a ValueError) like every other invalid spec value.
                raise ConfigurationError(  # noqa: TRY004
                    f"OffloadingSpec.{name} must be a str, got {value!r}"
                )
        if not self.model_name:
            raise ConfigurationError("OffloadingSpec.model_name must not be empty")
        if not self.dtype:
            raise ConfigurationError("OffloadingSpec.dtype must not be empty")
        for name in (
            "tokens_per_block",
            "blocks_per_file",
            "tp_size",
            "pp_size",
            "pcp_size",
            "dcp_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"OffloadingSpec.{name} must be an int >= 1, got {value!r}"
                )
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ConfigurationError(f"OffloadingSpec.rank must be an int >= 0, got {self.rank!r}")
        if not isinstance(self.kv_cache_groups, tuple):
            # A list from a config file is accepted; frozen means we must store a tuple.
            object.__setattr__(self, "kv_cache_groups", tuple(self.kv_cache_groups))

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


__all__ = ["OffloadingSpec"]
