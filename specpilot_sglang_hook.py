"""Start-up hook that registers SpecPilot into SGLang 0.5.x, which has no plugin registry.

``specpilot sglang-hook install`` writes ``specpilot_sglang.pth`` into site-packages; ``site`` runs its one
line at every interpreter start, SGLang's spawned scheduler/detokenizer processes included, and that line
imports this module. It is deliberately tiny and imports nothing heavy: it only puts a finder at the front
of ``sys.meta_path``. When (and only when) one of the SGLang modules below finishes loading, the finder
calls ``sglang_specpilot.sglang_plugin.patches.on_module_loaded`` on it. An interpreter that never imports
sglang pays one ``sys.meta_path`` lookup per import and nothing else.

Idempotent (a second import or ``install()`` call does nothing) and switched off by
``SPECPILOT_SGLANG_PLUGIN=0`` (also ``false``/``off``/``no``), which children inherit.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

ENV_SWITCH = "SPECPILOT_SGLANG_PLUGIN"
# The modules whose contents we extend; each is patched right after its own code has run.
TARGETS = frozenset(
    {
        "sglang.srt.server_args",
        "sglang.srt.speculative.spec_info",
        "sglang.srt.layers.quantization",
        "sglang.srt.model_loader.loader",
    }
)


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def _patch(module) -> None:
    from sglang_specpilot.sglang_plugin.patches import on_module_loaded

    on_module_loaded(module)


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the module it produced."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self.inner, name)


class SpecPilotFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders behind it, then wraps the loader of the target modules."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def installed() -> bool:
    return any(isinstance(f, SpecPilotFinder) or type(f).__name__ == "SpecPilotFinder" for f in sys.meta_path)


def install() -> bool:
    """Put the finder in place (once) and patch target modules that are already loaded. True if active."""
    if not enabled():
        return False
    if not installed():
        sys.meta_path.insert(0, SpecPilotFinder())
    for name in sorted(TARGETS):  # sorted: server_args before spec_info is irrelevant, but keep it stable
        module = sys.modules.get(name)
        if module is not None:
            _patch(module)
    return True


install()
