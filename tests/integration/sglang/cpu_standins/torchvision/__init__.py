"""A stand-in for torchvision in the CPU test environment of the SGLang integration.

Why: SGLang's host memory pools import ``sglang.srt.configs``, whose multimodal configs (and
the transformers modules they pull in) import torchvision at module level. The only
torchvision wheel for torch 2.13 is a CUDA build whose operator library cannot load next to
the CPU torch these tests use, so importing it fails. Nothing under test (HiCache storage,
host pools) uses torchvision: this package answers every ``torchvision.*`` import with a
module whose attributes are placeholders that raise when called. .ci/sglang-env.sh puts its
parent directory on the environment's path; a real SGLang deployment has its own, working
torchvision.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any, NoReturn

# transformers compares torchvision versions when it finds the package: the release that goes
# with torch 2.13, marked as this stand-in.
__version__ = "0.28.0+standin"


class InterpolationMode(enum.Enum):
    # SGLang's multimodal code only names these as default arguments.
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def placeholder(name: str) -> Callable[..., NoReturn]:
    """A callable named like torchvision's ``name`` that raises when called."""

    def unavailable(*args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(
            f"{name} is not available in kvtier's CPU test environment for SGLang "
            "(tests/integration/sglang/cpu_standins)"
        )

    unavailable.__name__ = name.rsplit(".", 1)[-1]
    return unavailable


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "InterpolationMode":
            return InterpolationMode
        return placeholder(f"{self.__name__}.{name}")


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import torchvision.<anything>`` with a stand-in module."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandinModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.append(_Submodules())


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return placeholder(f"{__name__}.{name}")
