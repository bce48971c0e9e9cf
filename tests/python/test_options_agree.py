"""Every option has one definition, and everything that states it agrees with it.

The native engine's defaults and ranges are defined once, in C++ (``EngineConfig``'s member
initialisers and the constants its checks use), and exported as ``_core.ENGINE_DEFAULTS``
and ``_core.ENGINE_LIMITS``. Checked here against them: the ``_core.Engine`` signature, the
Python option dataclasses (fs tier, GPU transfers) and their parser's ranges, the engine's
own refusals, and the option tables of docs/tiers.md, docs/gpu.md, docs/vllm.md and
docs/sglang.md (each documented default, read by the surface's own parser, must be the
default that surface uses).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from kvtier import _core
from kvtier.errors import ConfigurationError, InvalidArgumentError
from kvtier.gpu.options import GPUTransferOptions
from kvtier.tiering.fs.capacity.sizes import block_file_bytes
from kvtier.tiering.fs.options import FILE_MODE_BITS, FsTierOptions, StorageOptions

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
INTEGRATIONS = REPO / "python" / "kvtier" / "integrations"
REQUIRED = "<required>"


def _dataclass_defaults(cls: type) -> dict[str, Any]:
    return {
        f.name: (REQUIRED if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(cls)
    }


def _engine_signature_defaults() -> dict[str, Any]:
    """The keyword defaults pybind11 writes in ``Engine.__init__``'s signature."""
    first = _core.Engine.__init__.__doc__.splitlines()[0]
    fn = ast.parse(f"def {first}: ...").body[0]
    assert isinstance(fn, ast.FunctionDef)
    a = fn.args
    return {k.arg: ast.literal_eval(d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d}


# ---- C++ -> binding -> Python -------------------------------------------------------------


def test_engine_signature_defaults_are_the_cpp_defaults() -> None:
    assert _engine_signature_defaults() == _core.ENGINE_DEFAULTS
    assert len(_core.ENGINE_DEFAULTS) >= 18  # every EngineConfig field Python can set


@pytest.mark.parametrize("cls", [StorageOptions, FsTierOptions, GPUTransferOptions])
def test_dataclass_defaults_of_engine_options_are_the_engines(cls: type) -> None:
    defaults = _dataclass_defaults(cls)
    engine_options = {n for n in defaults if n in _core.ENGINE_DEFAULTS}
    assert engine_options >= {"n_read_threads", "worker_nice", "io_engine", "file_mode"}
    for name in engine_options:
        assert defaults[name] == _core.ENGINE_DEFAULTS[name], f"{cls.__name__}.{name}"


@pytest.mark.parametrize("cls", [FsTierOptions, GPUTransferOptions])
def test_default_options_pass_the_engine_its_own_defaults(cls: Any) -> None:
    """What a tier or transfer opened without options hands the engine: its defaults."""
    raw = {"root_dir": "/x"}
    parsed = cls.parse("fs", raw) if cls is FsTierOptions else cls.parse(raw)
    kwargs = parsed.engine_kwargs()
    assert set(kwargs) <= set(_core.ENGINE_DEFAULTS), set(kwargs) - set(_core.ENGINE_DEFAULTS)
    assert kwargs == {k: _core.ENGINE_DEFAULTS[k] for k in kwargs}


def test_block_file_sizes_use_the_cores_format_constants() -> None:
    header, align = _core.HEADER_SIZE, _core.ALIGNMENT
    assert block_file_bytes(0) == header
    assert block_file_bytes(1) == header + align
    assert block_file_bytes(align + 1) == header + 2 * align


# ---- ranges: the parser's are the engine's --------------------------------------------------


def _parse(option: str, value: Any) -> Any:
    raw = {"root_dir": "/x", option: value}
    if option.startswith("staging_"):
        return getattr(GPUTransferOptions.parse(raw), option)
    return getattr(FsTierOptions.parse("fs", raw), option)


RANGED = [
    "n_read_threads",
    "n_write_threads",
    "worker_nice",
    "load_nice",
    "max_stores_in_flight_while_loading",
    "staging_buffer_bytes",
]


@pytest.mark.parametrize("option", RANGED)
def test_parser_accepts_exactly_the_engines_range(option: str) -> None:
    lo, hi = _core.ENGINE_LIMITS[option]
    other = {"n_read_threads": "n_write_threads", "n_write_threads": "n_read_threads"}
    extra = {other[option]: 1} if option in other else {}  # keep the total at least 1
    raw = {"root_dir": "/x", **extra}

    def parse(value: int) -> Any:
        if option.startswith("staging_"):
            # A pool that holds the buffer, whatever its size.
            total = max(value, _core.ENGINE_DEFAULTS["staging_bytes_total"])
            staging = {option: value, "staging_bytes_total": total}
            return getattr(GPUTransferOptions.parse({**raw, **staging}), option)
        return getattr(FsTierOptions.parse("fs", {**raw, option: value}), option)

    assert parse(lo) == lo
    with pytest.raises(ConfigurationError, match=option):
        parse(lo - 1)
    if hi is None:
        big = 1 << 40
        assert parse(big) == big
    else:
        assert parse(hi) == hi
        with pytest.raises(ConfigurationError, match=option):
            parse(hi + 1)


def test_thread_total_and_staging_rules_are_the_engines() -> None:
    least = _core.ENGINE_LIMITS["n_threads_total"][0]
    with pytest.raises(ConfigurationError, match=f"at least {least}"):
        FsTierOptions.parse("fs", {"root_dir": "/x", "n_read_threads": 0, "n_write_threads": 0})
    multiple = _core.ENGINE_LIMITS["staging_buffer_bytes_multiple"]
    with pytest.raises(ConfigurationError, match=f"multiple of {multiple}"):
        _parse("staging_buffer_bytes", multiple * 3 + multiple // 2)
    # staging_bytes_total holds at least one buffer.
    raw = {"root_dir": "/x", "staging_buffer_bytes": 4 * multiple}
    with pytest.raises(ConfigurationError, match="staging_bytes_total"):
        GPUTransferOptions.parse({**raw, "staging_bytes_total": 3 * multiple})
    parsed = GPUTransferOptions.parse({**raw, "staging_bytes_total": 4 * multiple})
    assert parsed.staging_bytes_total == 4 * multiple


def test_file_mode_rules_are_within_the_engines() -> None:
    required = _core.ENGINE_LIMITS["file_mode_required_bits"]
    assert _parse("file_mode", required) == required
    for bit in (0o400, 0o200):
        if required & bit:
            with pytest.raises(ConfigurationError, match="file_mode"):
                _parse("file_mode", 0o777 & ~bit)
    # Python takes permission bits only: a narrower range than the engine's, never wider.
    lo, hi = _core.ENGINE_LIMITS["file_mode"]
    assert lo <= required and FILE_MODE_BITS <= hi
    assert _parse("file_mode", FILE_MODE_BITS) == FILE_MODE_BITS
    with pytest.raises(ConfigurationError, match="file_mode"):
        _parse("file_mode", FILE_MODE_BITS + 1)


@pytest.mark.parametrize("option", ["worker_nice", "load_nice"])
def test_engine_refuses_what_its_limits_exclude(tmp_path: Path, option: str) -> None:
    """ENGINE_LIMITS are what the engine checks (so the parser's ranges are the engine's)."""
    lo, hi = _core.ENGINE_LIMITS[option]
    base = {"n_read_threads": 1, "n_write_threads": 1, "io_engine": "psync"}
    for bad in (lo - 1, hi + 1):
        with pytest.raises(InvalidArgumentError, match=option):
            _core.Engine(str(tmp_path / "root"), **base, **{option: bad})
    engine = _core.Engine(str(tmp_path / "root"), **base, **{option: hi})
    engine.shutdown()


# ---- the docs' option tables ------------------------------------------------------------------


def _option_tables(doc: Path) -> list[tuple[list[str], str, str]]:
    """(names, default cell, meaning cell) of each row of the doc's "| option | default |"
    tables."""
    rows: list[tuple[list[str], str, str]] = []
    in_table = False
    for line in doc.read_text().splitlines():
        if line.startswith("| option | default |"):
            in_table = True
            continue
        if not in_table or not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= set("-: "):
            continue  # the separator row
        names = re.findall(r"`([a-z_0-9]+)`", cells[0])
        assert names, f"{doc.name}: no option name in {line!r}"
        rows.append((names, cells[1], cells[2] if len(cells) > 2 else ""))
    assert rows, f"{doc.name} has no option table"
    return rows


def _documented_value(cell: str) -> Any:
    """A default cell as the value a user would write (or REQUIRED)."""
    text = cell.replace("**", "").replace("`", "").strip()
    if "required" in text:
        return REQUIRED
    if "by the machine" in text:
        return None  # machine-sized: the None default
    if text in ("None", "null"):
        return None
    if text in ("true", "false"):
        return text == "true"
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    size = re.fullmatch(r"(\d+) (KiB|MiB|GiB)", text)
    if size:
        return int(size.group(1)) << {"KiB": 10, "MiB": 20, "GiB": 30}[size.group(2)]
    return ast.literal_eval(text)  # 19, 0.05, 0o600


def _documented_defaults(doc: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for names, cell, _ in _option_tables(doc):
        values = [cell] if len(names) == 1 else [v.strip() for v in cell.split(",")]
        if len(values) == 1:
            values = values * len(names)  # "n_read_threads, n_write_threads | by the machine"
        assert len(values) == len(names), f"{doc.name}: {names} vs {cell!r}"
        for name, value in zip(names, values):
            out[name] = _documented_value(value)
    return out


def _adapter_overrides(module: str) -> dict[str, Any]:
    """Defaults an engine adapter sets itself: its ``options.setdefault(name, value)`` calls
    (read from its source: the engines are not installed here)."""
    tree = ast.parse((INTEGRATIONS / f"{module}.py").read_text())
    out: dict[str, Any] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setdefault"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "options"
        ):
            out[ast.literal_eval(node.args[0])] = ast.literal_eval(node.args[1])
    return out


def _as_parsed(cls: Any, name: str, value: Any) -> Any:
    """``value`` for option ``name`` as the surface's parser reads it (``"0600"`` -> 0o600)."""
    if value is REQUIRED:
        return REQUIRED
    if name == "root_dir":
        return value
    raw = {"root_dir": "/x", name: value}
    parsed = cls.parse(raw) if cls is GPUTransferOptions else cls.parse("fs", raw)
    return getattr(parsed, name)


def _check_doc(doc: str, cls: Any, overrides: dict[str, Any] | None = None) -> set[str]:
    expected = {**_dataclass_defaults(cls), **(overrides or {})}
    documented = _documented_defaults(DOCS / doc)
    for name, value in documented.items():
        assert name in expected, f"docs/{doc} documents {name!r}, which is not an option"
        assert _as_parsed(cls, name, value) == expected[name], (
            f"docs/{doc}: default of {name!r} is documented as {value!r}, the code's is "
            f"{expected[name]!r}"
        )
    return set(documented)


def test_tiers_doc_lists_every_fs_option_with_its_default() -> None:
    documented = _check_doc("tiers.md", FsTierOptions)
    assert documented == set(FsTierOptions.option_names())


def test_tiers_doc_states_the_engines_ranges() -> None:
    for names, _, meaning in _option_tables(DOCS / "tiers.md"):
        for name in names:
            if name in ("n_read_threads", "n_write_threads", "worker_nice", "load_nice"):
                lo, hi = _core.ENGINE_LIMITS[name]
                assert f"{lo}–{hi}" in meaning, f"docs/tiers.md: range of {name}"


def test_gpu_doc_lists_the_transfers_own_options_with_their_defaults() -> None:
    documented = _check_doc("gpu.md", GPUTransferOptions)
    own = set(GPUTransferOptions.option_names()) - set(StorageOptions.option_names())
    assert documented == own


def test_vllm_doc_defaults_are_the_adapters() -> None:
    overrides = _adapter_overrides("vllm")
    assert overrides == {"async_lookup": True}  # the one default the adapter changes
    documented = _check_doc("vllm.md", FsTierOptions, overrides)
    assert documented == set(FsTierOptions.option_names())


def test_sglang_doc_defaults_are_the_backends() -> None:
    overrides = _adapter_overrides("sglang")
    assert overrides == {}  # the backend parses with the fs tier's defaults
    documented = _check_doc("sglang.md", FsTierOptions, overrides)
    assert documented >= {"root_dir", "n_read_threads", "io_engine", "worker_nice"}
