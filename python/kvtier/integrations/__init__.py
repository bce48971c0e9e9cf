"""Adapters that plug kvtier's tiers into inference engines.

Each engine has its own submodule (``kvtier.integrations.vllm``), imported explicitly by the
engine's configuration. This package imports no engine, so importing kvtier never pulls in
one.
"""
