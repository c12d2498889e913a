"""Test support for the SGLang contract tests: the real ``sglang`` package, imported on a CPU-only torch.

CI installs ``sglang==0.5.10.post1 --no-deps`` plus the light packages its imports need (``make
install-sglang``); without it the contract tests skip and say so.
"""

from __future__ import annotations

import importlib.util

import pytest

SGLANG_VERSION = "0.5.10.post1"
SGLANG_MISSING = importlib.util.find_spec("sglang") is None

needs_sglang = pytest.mark.skipif(
    SGLANG_MISSING,
    reason=f"sglang is not installed (contract tests need sglang=={SGLANG_VERSION}: `make install-sglang`)",
)


def import_sglang() -> None:
    """Serve the CPU stand-ins, activate the start-up hook in this process, and check the version."""
    from importlib.metadata import version

    from tests.sglang_support.standins import install as install_standins

    got = version("sglang")
    if got != SGLANG_VERSION:
        pytest.skip(f"contract tests target sglang=={SGLANG_VERSION}, found {got}")
    install_standins()
    import specpilot_sglang_hook

    if not specpilot_sglang_hook.install():
        pytest.skip(f"{specpilot_sglang_hook.ENV_SWITCH}=0 switches the plugin off")
