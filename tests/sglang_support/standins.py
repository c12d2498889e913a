"""Empty ``torchvision`` and ``sgl_kernel`` for importing sglang 0.5.10.post1 on a CPU-only torch (tests only).

sglang imports torchvision at module level (``srt/utils/common.py``: ``from torchvision.io import
decode_jpeg``), and PyPI's torchvision cannot load beside a ``+cpu`` torch. The contract tests never decode
an image, so every ``torchvision.*`` module is served empty and any attribute is a callable that raises.

Install it only after ``transformers`` has looked for torchvision and cached "unavailable"; otherwise
transformers would take the stand-in for the real thing. A real torchvision, when importable, wins.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

# Package -> the modules served (None = every module of the package); served modules hand out stub callables.
# sgl_kernel (CUDA kernels, no CPU build) is imported unconditionally by one module the standalone worker
# pulls in (``mem_cache/memory_pool_host.py``: ``sgl_kernel.kvcacheio``); every other sgl_kernel import in
# sglang sits in a try/except ImportError with a CPU fallback, so those must keep failing.
STAND_INS = {"torchvision": None, "sgl_kernel": {"sgl_kernel.kvcacheio"}}


def _unavailable(name: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{name}: stand-in (tests only); the real package cannot load here")

    fail.__name__ = name.rsplit(".", 1)[-1]
    return fail


class _StandInModule(types.ModuleType):
    lenient = True

    def __getattr__(self, attr: str):
        if attr.startswith("__") or not self.lenient:
            raise AttributeError(attr)
        return _unavailable(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, top: str, modules: set[str] | None):
        self.top, self.modules = top, modules

    def find_spec(self, fullname, path, target=None):
        if fullname != self.top and not fullname.startswith(self.top + "."):
            return None
        if fullname != self.top and self.modules is not None and fullname not in self.modules:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.lenient = self.modules is None or spec.name in self.modules
        module.__path__ = []
        module.__version__ = "0.0.0+standin"
        return module

    def exec_module(self, module):
        pass


def _importable(top: str) -> bool:
    try:
        if importlib.util.find_spec(top) is None:
            return False
        importlib.import_module(top)
        return True
    except Exception:  # torchvision: "operator torchvision::nms does not exist"; sgl_kernel: no CPU build
        for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[name]
        return False


def install() -> None:
    """Serve stand-ins for torchvision and sgl_kernel where the real ones cannot be imported; idempotent."""
    import transformers.utils.import_utils  # noqa: F401  (caches torchvision's absence first)

    served = {f.top for f in sys.meta_path if isinstance(f, _Finder)}
    for top, modules in STAND_INS.items():
        if top not in served and not _importable(top):
            sys.meta_path.append(_Finder(top, modules))
