"""python/kvtier/_core.pyi describes the built extension module exactly.

Two checks: mypy's stubtest (names, kinds, property and constant types), and, because the
signatures of pybind11 functions are invisible to ``inspect`` (and so to stubtest), the
signature pybind11 writes as the first line of each docstring, compared parameter by
parameter (name, kind, default) with the stub's.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import kvtier
import pytest
from kvtier import _core

HERE = Path(__file__).resolve().parent
STUB = Path(kvtier.__file__).resolve().parent / "_core.pyi"
ALLOWLIST = HERE / "core_stub_allowlist.txt"
# Attributes pybind11 adds to every class and module, never part of the API.
_PYBIND_INTERNALS = {"_pybind11_conduit_v1_"}


def test_stubtest_finds_no_difference(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is part of the test extra (pip install '.[test]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "kvtier._core", "--allowlist", str(ALLOWLIST)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,  # the installed package is what is checked; its cache lands here
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- signatures from pybind11's docstrings ---------------------------------------------------

Param = tuple[str, str, Any]  # (name, kind, default); default NO_DEFAULT or ANY_DEFAULT
NO_DEFAULT = "<none>"
ANY_DEFAULT = "<any>"  # the stub's "= ...": some default, given elsewhere (ENGINE_DEFAULTS)


def _params(fn: ast.FunctionDef) -> list[Param]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
    defaults += a.defaults
    out: list[Param] = []
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = "positional-only" if i < len(a.posonlyargs) else "positional"
        out.append((arg.arg, kind, _default(default)))
    if a.vararg is not None:
        out.append((a.vararg.arg, "*args", NO_DEFAULT))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "keyword-only", _default(default)))
    if a.kwarg is not None:
        out.append((a.kwarg.arg, "**kwargs", NO_DEFAULT))
    return out


def _default(node: ast.expr | None) -> Any:
    if node is None:
        return NO_DEFAULT
    if isinstance(node, ast.Constant) and node.value is Ellipsis:
        return ANY_DEFAULT
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _runtime_signature(obj: Any, name: str) -> list[Param]:
    """The parameters pybind11 documents for ``obj`` (first docstring line)."""
    first = (obj.__doc__ or "").splitlines()[0] if obj.__doc__ else ""
    assert first.startswith(f"{name}("), f"{name}: no pybind11 signature in {obj.__doc__!r}"
    tree = ast.parse(f"def {first}: ...")
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    return _params(fn)


def _stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def _stub_members(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    out: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def _public_runtime_names(namespace: dict[str, Any], keep: set[str]) -> set[str]:
    return {
        n for n in namespace if n not in _PYBIND_INTERNALS and (not n.startswith("__") or n in keep)
    }


def _agree(stub: list[Param], runtime: list[Param], what: str) -> None:
    assert [p[:2] for p in stub] == [p[:2] for p in runtime], what
    for (name, _, s), (_, _, r) in zip(stub, runtime):
        if s == ANY_DEFAULT:
            assert r != NO_DEFAULT, f"{what}: stub gives {name} a default, the binding none"
        else:
            assert s == r, f"{what}: default of {name} is {r!r} in the binding, {s!r} in the stub"


def test_module_names_are_the_stubs() -> None:
    stub = _stub_members(_stub_tree().body)
    runtime = _public_runtime_names(vars(_core), keep=set())
    stub_public = {n for n in stub if not n.startswith("_")}
    assert stub_public == {n for n in runtime if not n.startswith("_")}
    # Private hooks of the module (e.g. _crc32c_chunks) are declared too; the stub's own
    # helper names (type aliases, the metaclass) have no runtime counterpart.
    assert {n for n in runtime if n.startswith("_")} <= set(stub)


def test_functions_have_the_stubs_signatures() -> None:
    stub = _stub_members(_stub_tree().body)
    checked = 0
    for name, obj in vars(_core).items():
        if name.startswith("_") or isinstance(obj, type) or not callable(obj):
            continue
        fn = stub[name]
        assert isinstance(fn, ast.FunctionDef), name
        _agree(_params(fn), _runtime_signature(obj, name), name)
        checked += 1
    assert checked >= 10  # every function of the module, not a vacuous loop


@pytest.mark.parametrize("cls", ["Engine", "BlockLayout", "Completion", "Direction"])
def test_class_members_and_methods_are_the_stubs(cls: str) -> None:
    node = _stub_members(_stub_tree().body)[cls]
    assert isinstance(node, ast.ClassDef)
    stub = _stub_members(node.body)
    runtime_cls = getattr(_core, cls)
    # __init__ only where the binding defines a constructor (Completion has none).
    keep = {"__init__"} if "__init__" in stub else set()
    runtime = _public_runtime_names(vars(runtime_cls), keep)
    runtime -= {"__repr__"}  # a repr needs no stub
    if cls == "Direction":  # pybind11's enum machinery: the stub spells out what callers use
        runtime -= {"__members__", "__int__", "__index__", "__eq__", "__ne__", "__hash__"}
        runtime -= {"__getstate__", "__setstate__", "__str__"}
        stub = {k: v for k, v in stub.items() if not k.startswith("__") or k == "__init__"}
    assert set(stub) == runtime, cls
    for name, member in stub.items():
        if not isinstance(member, ast.FunctionDef):
            continue
        if any(isinstance(d, ast.Name) and d.id == "property" for d in member.decorator_list):
            assert isinstance(vars(runtime_cls)[name], property), f"{cls}.{name}"
            continue
        runtime_params = _runtime_signature(getattr(runtime_cls, name), name)
        _agree(_params(member), runtime_params, f"{cls}.{name}")


def test_engine_signature_defaults_are_engine_defaults() -> None:
    """The binding's keyword defaults are ENGINE_DEFAULTS (the stub leaves them to it)."""
    params = _runtime_signature(_core.Engine.__init__, "__init__")
    keywords = {name: default for name, kind, default in params if kind == "keyword-only"}
    assert keywords == dict(_core.ENGINE_DEFAULTS)
