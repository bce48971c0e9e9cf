"""Registry of secondary tier types; builds a tier from a configuration dict.

Registration is lazy: a tier's module is imported only when a tier of that type is created,
so importing kvtier costs nothing for tiers a deployment does not use.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from kvtier.errors import ConfigurationError, InvalidArgumentError
from kvtier.tiering.base import SecondaryTierManager
from kvtier.tiering.spec import OffloadingSpec

logger = logging.getLogger(__name__)

# Renamed tier types keep working. Data, not code: the next rename is one line here.
_TYPE_ALIASES: dict[str, str] = {
    "fs_python": "fs",
}

# Constructor parameters the factory fills itself; never options.
_FRAMEWORK_PARAMS = frozenset({"self", "offloading_spec", "primary_kv_view", "tier_type"})


def _format_unknown(tier_type: str, unknown: list[str], valid: list[str]) -> str:
    noun = "option" if len(unknown) == 1 else "options"
    names = ", ".join(repr(k) for k in unknown)
    return f"Unknown {noun} {names} for secondary tier '{tier_type}'. Valid options: {valid}"


def check_tier_options(
    tier_cls: type[SecondaryTierManager], tier_type: str, options: Mapping[str, Any]
) -> None:
    """Raise ConfigurationError (a ValueError) naming unknown option keys before the
    constructor would raise TypeError.

    A tier whose ``__init__`` takes ``**kwargs`` validates its own options.
    """
    params = inspect.signature(tier_cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [
        name
        for name, p in params.items()
        if name not in _FRAMEWORK_PARAMS
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    unknown = sorted(k for k in options if k not in valid)
    if unknown:
        raise ConfigurationError(_format_unknown(tier_type, unknown, valid))


class SecondaryTierFactory:
    """Registry of :class:`SecondaryTierManager` implementations, resolved by ``type``.

    Out-of-tree tiers need no registration: a config with ``module_path`` and a ``type``
    naming a class in that module loads it directly.
    """

    # One registry per process, shared by every caller: registration is global on purpose.
    _registry: ClassVar[dict[str, Callable[[], type[SecondaryTierManager]]]] = {}

    @classmethod
    def register_tier(cls, tier_type: str, module_path: str, class_name: str) -> None:
        """Register ``tier_type``; nothing is imported until a tier of that type is created."""
        if tier_type in cls._registry or tier_type in _TYPE_ALIASES:
            raise InvalidArgumentError(f"Tier '{tier_type}' is already registered.")

        def loader() -> type[SecondaryTierManager]:
            module = importlib.import_module(module_path)
            tier_cls = getattr(module, class_name)
            _check_subclass(tier_cls, f"{module_path}.{class_name}")
            return tier_cls

        cls._registry[tier_type] = loader

    @classmethod
    def supported_types(cls) -> list[str]:
        return list(cls._registry)

    @classmethod
    def _resolve_type(cls, tier_config: Mapping[str, Any]) -> str:
        tier_type = tier_config.get("type")
        if not tier_type:
            raise ConfigurationError("Secondary tier configuration must include 'type'")
        if not isinstance(tier_type, str):
            # Bad configuration, whatever its Python type: ConfigurationError, as for all of them.
            raise ConfigurationError(  # noqa: TRY004
                f"Secondary tier 'type' must be a string, got {tier_type!r}"
            )
        new_type = _TYPE_ALIASES.get(tier_type)
        if new_type is not None and new_type in cls._registry:
            message = (
                f"Secondary tier type '{tier_type}' is deprecated; use type: {new_type} "
                "in the tier configuration."
            )
            warnings.warn(message, DeprecationWarning, stacklevel=3)
            logger.warning("%s", message)
            return new_type
        return tier_type

    @classmethod
    def get_tier_class(cls, tier_config: Mapping[str, Any]) -> type[SecondaryTierManager]:
        """The class a configuration creates (imports its module on first use)."""
        return cls._get_tier_class(cls._resolve_type(tier_config), tier_config)

    @classmethod
    def _get_tier_class(
        cls, tier_type: str, tier_config: Mapping[str, Any]
    ) -> type[SecondaryTierManager]:
        loader = cls._registry.get(tier_type)
        if loader is not None:
            return loader()
        module_path = tier_config.get("module_path")
        if not module_path:
            raise ConfigurationError(
                f"Unknown secondary tier type: '{tier_type}'. "
                f"Supported types: {cls.supported_types()}"
            )
        logger.info("Loading out-of-tree secondary tier '%s' from '%s'", tier_type, module_path)
        module = importlib.import_module(module_path)
        tier_cls = getattr(module, tier_type, None)
        if tier_cls is None:
            raise ConfigurationError(
                f"Out-of-tree secondary tier: module '{module_path}' has no class '{tier_type}'"
            )
        _check_subclass(tier_cls, f"{module_path}.{tier_type}")
        return tier_cls

    @classmethod
    def create_secondary_tier(
        cls,
        tier_config: Mapping[str, Any],
        primary_kv_view: memoryview,
        offloading_spec: OffloadingSpec,
    ) -> SecondaryTierManager:
        """Build a tier: ``type`` picks the class, every other key is a keyword option.

        The caller's dict is never modified.
        """
        config = dict(tier_config)
        tier_type = cls._resolve_type(config)
        tier_cls = cls._get_tier_class(tier_type, config)
        config.pop("type")
        config.pop("module_path", None)
        check_tier_options(tier_cls, tier_type, config)
        return tier_cls(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            **config,
        )


def _check_subclass(tier_cls: Any, name: str) -> None:
    if not (isinstance(tier_cls, type) and issubclass(tier_cls, SecondaryTierManager)):
        # A configuration naming the wrong class is a configuration error.
        raise ConfigurationError(  # noqa: TRY004
            f"Secondary tier class '{name}' must subclass kvtier.tiering.base.SecondaryTierManager"
        )


SecondaryTierFactory.register_tier(
    "example", "kvtier.tiering.example.manager", "ExampleSecondaryTierManager"
)
SecondaryTierFactory.register_tier("fs", "kvtier.tiering.fs.manager", "FileSystemTierManager")


__all__ = ["SecondaryTierFactory", "check_tier_options"]
