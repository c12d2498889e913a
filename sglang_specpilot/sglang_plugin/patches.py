"""The SGLang 0.5.x patches, one per module, applied as each module finishes loading.

``specpilot_sglang_hook`` calls :func:`on_module_loaded` for the modules in its ``TARGETS``; each patch
marks the module so a second call does nothing. What each one does:

- ``sglang.srt.server_args``: ``--speculative-algorithm`` also accepts ``specpilot`` / ``SPECPILOT``;
  ``--quantization`` (and the draft model's) also accepts ``w12``; ``_handle_speculative_decoding`` runs
  ``server_args_policy`` for the specpilot name.
- ``sglang.srt.speculative.spec_info``: ``SpeculativeAlgorithm.from_string("specpilot")`` is STANDALONE
  (so every ``is_standalone()`` branch - draft/verify CUDA graphs, hidden-state capture, KV reservation -
  treats it as the standalone flow it is), and ``create_worker`` returns ``SpecPilotWorker`` whenever
  ``server_args.speculative_algorithm`` is specpilot.
- ``sglang.srt.layers.quantization``: ``QUANTIZATION_METHODS["w12"] = W12Config``.
- ``sglang.srt.model_loader.loader``: a model with W12 layers reads its checkpoint through
  ``w12_weights.w12_weight_stream``.
"""

from __future__ import annotations

import functools
import types

from sglang_specpilot.sglang_plugin import ALGORITHM, QUANT_METHOD

_MARK = "_specpilot_patched"


def _once(module: types.ModuleType) -> bool:
    """True the first time for ``module`` (and marks it)."""
    if getattr(module, _MARK, False):
        return False
    setattr(module, _MARK, True)
    return True


def patch_server_args(mod: types.ModuleType) -> None:
    from sglang_specpilot.sglang_plugin import server_args_policy

    for choices in (mod.QUANTIZATION_CHOICES, mod.SPECULATIVE_DRAFT_MODEL_QUANTIZATION_CHOICES):
        if QUANT_METHOD not in choices:
            choices.append(QUANT_METHOD)  # argparse holds these very lists as its choices
    cls = mod.ServerArgs
    add_cli_args = cls.add_cli_args  # a staticmethod, read through the class: the plain function

    @functools.wraps(add_cli_args)
    def add_cli_args_with_specpilot(parser):
        add_cli_args(parser)
        for action in parser._actions:  # argparse has no public way to extend an option's choices
            if action.dest == "speculative_algorithm" and action.choices is not None:
                action.choices = [*action.choices, ALGORITHM, ALGORITHM.lower()]

    cls.add_cli_args = staticmethod(add_cli_args_with_specpilot)
    handle = cls._handle_speculative_decoding

    @functools.wraps(handle)
    def handle_speculative_decoding(self):
        server_args_policy.handle_speculative_decoding(self, handle)

    cls._handle_speculative_decoding = handle_speculative_decoding


def patch_spec_info(mod: types.ModuleType) -> None:
    from sglang_specpilot.sglang_plugin.server_args_policy import is_specpilot

    algo = mod.SpeculativeAlgorithm
    from_string = algo.from_string.__func__  # the classmethod's function
    create_worker = algo.create_worker

    @functools.wraps(from_string)
    def from_string_with_specpilot(cls, name):
        return cls.STANDALONE if is_specpilot(name) else from_string(cls, name)

    @functools.wraps(create_worker)
    def create_worker_with_specpilot(self, server_args):
        if is_specpilot(getattr(server_args, "speculative_algorithm", None)):
            from sglang_specpilot.sglang_plugin.worker import SpecPilotWorker

            return SpecPilotWorker
        return create_worker(self, server_args)

    # Enum classes allow assigning methods on the class (members are what they protect).
    algo.from_string = classmethod(from_string_with_specpilot)
    algo.create_worker = create_worker_with_specpilot


def patch_quantization(mod: types.ModuleType) -> None:
    from sglang_specpilot.sglang_plugin.w12_method import W12Config

    mod.QUANTIZATION_METHODS.setdefault(QUANT_METHOD, W12Config)


def patch_loader(mod: types.ModuleType) -> None:
    from sglang_specpilot.sglang_plugin.w12_weights import uses_w12, w12_weight_stream

    cls = mod.DefaultModelLoader
    load = cls.load_weights_and_postprocess  # staticmethod: the plain function

    @functools.wraps(load)
    def load_weights_and_postprocess(model, weights, target_device):
        if uses_w12(model):
            weights = w12_weight_stream(weights, model)
        return load(model, weights, target_device)

    cls.load_weights_and_postprocess = staticmethod(load_weights_and_postprocess)


PATCHES = {
    "sglang.srt.server_args": patch_server_args,
    "sglang.srt.speculative.spec_info": patch_spec_info,
    "sglang.srt.layers.quantization": patch_quantization,
    "sglang.srt.model_loader.loader": patch_loader,
}


def on_module_loaded(module: types.ModuleType) -> None:
    """Apply the patch for ``module`` (by name) once; other modules are ignored."""
    patch = PATCHES.get(module.__name__)
    if patch is not None and _once(module):
        patch(module)


def apply_loaded() -> list[str]:
    """Patch whichever target modules are already imported (for use without the start-up hook)."""
    import sys

    done = []
    for name in PATCHES:
        if name in sys.modules:
            on_module_loaded(sys.modules[name])
            done.append(name)
    return done
