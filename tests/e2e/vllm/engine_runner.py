"""A real vLLM 0.33 engine on the CPU, one per child process, driven from the test process.

vLLM's engine takes ~20 s to start here and owns process-wide state (its KV cache, a
shared-memory region, Prometheus collectors), so each engine runs in its own spawned process
(``EngineProcess``) and one engine answers many commands: ``generate``, ``reset``,
``metrics`` and ``tier_stats``. The engine core runs inside that process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so kvtier's tier, which lives in vLLM's scheduler, can
report its own counters. Also used by bench/vllm_ttft.py.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = (
    "vLLM is not installed in this environment; the vLLM engine tests run in their own venv: "
    "bash .ci/vllm-engine-env.sh .venv-vllm-engine && "
    ".venv-vllm-engine/bin/python -m pytest tests/e2e/vllm"
)

# Three prompts sharing a 640-token prefix (5 offloaded chunks of 128 tokens), each with its
# own 40-token tail (never a full chunk, so never stored).
PREFIX_TOKENS = 640
PREFIX_CHUNKS = 5
MAX_TOKENS = 8
# KV bytes of one chunk of the tiny model: 128 tokens x 2 layers x (K, V) x 2 heads x 64 x bf16.
CHUNK_BYTES = 128 * 2 * 2 * 2 * 64 * 2


KVTIER_TIER = {"type": "KvtierFileSystemTier", "module_path": "kvtier.integrations.vllm"}
# The offloaded chunk: 128 tokens per kvtier block file.
CHUNK_TOKENS = 128
START_TIMEOUT_S = 600.0
COMMAND_TIMEOUT_S = 600.0

ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache for the engine ("GPU" blocks)
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # the machine is shared: no core pinning
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}


def build_random_llama(
    path: Path,
    *,
    vocab: int = 1024,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 2,
    head_dim: int = 64,
    intermediate: int = 256,
    max_positions: int = 4096,
) -> Path:
    """A LlamaForCausalLM with random weights and a word-level tokenizer, saved offline.

    Token ``i >= 3`` is the word ``w<i>``; the CPU attention backend needs head_dim 32, 64, 80..."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(path)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


def kv_transfer_config(tier: dict[str, Any], cpu_bytes: int = 64 << 20) -> dict[str, Any]:
    """vLLM's OffloadingConnector with the CPU primary tier and one secondary tier."""
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "CpuTestTieringOffloadingSpec",
            "spec_module_path": "cpu_offloading_spec",
            "cpu_bytes_to_use": cpu_bytes,
            "block_size": CHUNK_TOKENS,
            "secondary_tiers": [tier],
        },
    }


def kvtier_config(root: os.PathLike[str] | str, **options: Any) -> dict[str, Any]:
    return kv_transfer_config({**KVTIER_TIER, "root_dir": str(root), **options})


@dataclass
class EngineSettings:
    model: str
    kv_transfer: dict[str, Any] | None = None  # None: no offloading
    max_model_len: int = 2048
    extra: dict[str, Any] = field(default_factory=dict)  # more LLM(...) keywords


# -- the child process ---------------------------------------------------------------------


def _metric_values(llm: Any) -> dict[str, float]:
    """Counters and gauges of vLLM's metrics registry, summed by name and labels."""
    from vllm.v1.metrics.reader import Counter, Gauge

    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        if isinstance(metric, (Counter, Gauge)):
            labels = ",".join(f"{k}={v}" for k, v in sorted(metric.labels.items()))
            key = f"{metric.name}{{{labels}}}"
            out[key] = out.get(key, 0.0) + float(metric.value)
    return out


def _kvtier_stats() -> dict[str, int | str]:
    import cpu_offloading_spec
    from kvtier.integrations.vllm import KvtierFileSystemTier

    tiers = [
        tier
        for manager in cpu_offloading_spec.MANAGERS
        for tier in manager.secondary_tiers
        if isinstance(tier, KvtierFileSystemTier)
    ]
    if len(tiers) != 1:
        raise RuntimeError(f"expected one kvtier tier in this engine, found {len(tiers)}")
    return tiers[0].stats()


def _serve(conn: Any, settings: EngineSettings) -> None:
    os.environ.update(ENGINE_ENV)
    sys.path.insert(0, str(HERE))  # cpu_offloading_spec, for vLLM's spec_module_path
    try:
        from vllm import LLM
        from vllm.config import KVTransferConfig

        kwargs: dict[str, Any] = {
            "model": settings.model,
            "enforce_eager": True,
            "max_model_len": settings.max_model_len,
            "dtype": "bfloat16",
            "disable_log_stats": False,
            "seed": 0,
            **settings.extra,
        }
        if settings.kv_transfer is not None:
            kwargs["kv_transfer_config"] = KVTransferConfig(**settings.kv_transfer)
        llm = LLM(**kwargs)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", None))
    _answer_commands(conn, llm)
    del llm  # shuts the engine down (and kvtier's tier with it) before the process exits
    conn.send(("ok", None))


def _answer_commands(conn: Any, llm: Any) -> None:
    """Run the test process's commands on ``llm`` until it sends ``close``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def generate(prompts: Sequence[Sequence[int]], max_tokens: int = 8) -> list[list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
        )
        return [list(o.outputs[0].token_ids) for o in outputs]

    commands = {
        "generate": generate,
        "reset": lambda: llm.reset_prefix_cache(reset_connector=True),
        "metrics": lambda: _metric_values(llm),
        "tier_stats": _kvtier_stats,
    }
    while True:
        name, args = conn.recv()
        if name == "close":
            return
        try:
            conn.send(("ok", commands[name](**args)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


# -- the test process's handle -------------------------------------------------------------


class EngineError(RuntimeError):
    pass


class EngineProcess:
    """One vLLM engine in a spawned child process; methods block until it answers."""

    def __init__(self, settings: EngineSettings) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, settings), daemon=False)
        self._process.start()
        child.close()
        self._answer(START_TIMEOUT_S, "start")

    def _answer(self, timeout: float, what: str) -> Any:
        if not self._conn.poll(timeout):
            self.kill()
            raise EngineError(f"the engine did not answer '{what}' within {timeout:.0f}s")
        try:
            status, value = self._conn.recv()
        except EOFError:
            self._process.join(5)
            raise EngineError(
                f"the engine process died during '{what}' (exit code {self._process.exitcode})"
            ) from None
        if status == "error":
            raise EngineError(f"'{what}' failed in the engine process:\n{value}")
        return value

    def call(self, name: str, timeout: float = COMMAND_TIMEOUT_S, **args: Any) -> Any:
        self._conn.send((name, args))
        return self._answer(timeout, name)

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int = 8) -> list[list[int]]:
        return self.call("generate", prompts=[list(p) for p in prompts], max_tokens=max_tokens)

    def metrics(self) -> dict[str, float]:
        return self.call("metrics")

    def tier_stats(self) -> dict[str, int | str]:
        return self.call("tier_stats")

    def reset(self) -> bool:
        return self.call("reset")

    def close(self, timeout: float = 120.0) -> None:
        if self._process.is_alive():
            try:
                self.call("close", timeout=timeout)
            except (EngineError, OSError):
                pass
            self._process.join(timeout)
        self.kill()

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join(10)
