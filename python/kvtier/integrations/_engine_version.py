"""Finding an inference engine's installed version, and refusing one kvtier does not support.

Shared by the engine integrations (vllm, sglang) so that both fail the same way, with an
ImportError naming the supported versions, before touching any engine API.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineRequirement:
    """What an integration module needs of its engine, in the words its errors use."""

    integration: str
    """The kvtier module that needs the engine, e.g. ``kvtier.integrations.vllm``."""
    engine: str
    """The engine's name as written in messages, e.g. ``vLLM``."""
    package: str
    """The engine's import and distribution name, e.g. ``vllm``."""
    supported_text: str
    """The supported versions as written in messages, e.g. ``0.33.x``."""
    pip_requirement: str
    """What to install to get a supported version, e.g. ``vllm==0.33.*``."""

    def installed_version(self) -> str:
        """The installed engine's version; ImportError (naming what is supported) when absent."""
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):  # ValueError: sys.modules[package] is None
            spec = None
        if spec is None:
            raise ImportError(
                f"{self.integration} needs {self.engine} ({self.supported_text}), which is not "
                f"installed. Install it with: pip install '{self.pip_requirement}'"
            )
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path
            module = importlib.import_module(self.package)
            return str(module.__version__)

    def check(self, version: str, supported: Callable[[str], bool]) -> None:
        """Raise ImportError unless ``supported(version)``."""
        if not supported(version):
            raise ImportError(
                f"{self.integration} supports {self.engine} {self.supported_text}, but "
                f"{self.engine} {version} is installed. Install a supported version (pip install "
                f"'{self.pip_requirement}') or a kvtier release that supports this {self.engine}."
            )

    def supported_installed_version(self, supported: Callable[[str], bool]) -> str:
        """The installed engine's version, after checking that it is supported."""
        version = self.installed_version()
        self.check(version, supported)
        return version
