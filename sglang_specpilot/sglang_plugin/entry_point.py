"""Entry point ``sglang.srt.plugins: specpilot`` for SGLang with a plugin registry (after 0.5.x).

SGLang's ``load_plugins()`` calls :func:`register` in each of its processes. Where
``SpeculativeAlgorithm.register`` exists, ``SPECPILOT`` is registered as a custom algorithm that answers
``is_standalone()`` like the flow it runs on; the factory hands SGLang our worker. On SGLang 0.5.x (no
registry; the entry point is never called there, but a user may call it by hand) it applies the
module patches instead, as the start-up hook would.

Not yet run against a SGLang with the registry (none is served by the package index here): the registry
path follows the upstream API as read (``register(name, spec_class=..., validate_server_args=...)``),
and upstream removed the V1 ``StandaloneWorker`` our worker extends, so there the factory raises.
"""

from __future__ import annotations

from sglang_specpilot.sglang_plugin import ALGORITHM


def _worker_factory(server_args):
    try:
        from sglang_specpilot.sglang_plugin.worker import SpecPilotWorker
    except ImportError as e:
        raise RuntimeError(
            "specpilot's worker extends SGLang's V1 StandaloneWorker, which this SGLang no longer has; "
            "use sglang 0.5.x with `specpilot sglang-hook install`"
        ) from e
    return SpecPilotWorker


def _validate(server_args) -> None:
    from sglang_specpilot.sglang_plugin.server_args_policy import apply_defaults

    apply_defaults(server_args)


def register() -> str:
    """Register ``specpilot`` with SGLang; returns ``"registry"`` or ``"patched"`` (which route was taken)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if hasattr(SpeculativeAlgorithm, "register"):
        from sglang.srt.speculative.spec_registry import CustomSpecAlgo

        class SpecPilotAlgo(CustomSpecAlgo):
            def is_standalone(self) -> bool:
                return True

        SpeculativeAlgorithm.register(ALGORITHM, spec_class=SpecPilotAlgo, validate_server_args=_validate)(
            _worker_factory
        )
        return "registry"
    import sglang.srt.layers.quantization  # noqa: F401  (each import runs its patch through the hook)
    import sglang.srt.model_loader.loader  # noqa: F401
    import sglang.srt.server_args  # noqa: F401

    from sglang_specpilot.sglang_plugin.patches import apply_loaded

    apply_loaded()
    return "patched"
