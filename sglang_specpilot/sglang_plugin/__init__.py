"""SpecPilot inside SGLang: speculative algorithm ``specpilot`` and quantization method ``w12``.

The only package that imports ``sglang`` (DESIGN.md). Two ways in:

- SGLang 0.5.x (no plugin registry): the start-up hook ``specpilot_sglang_hook`` (installed as a ``.pth``
  by ``specpilot sglang-hook install``) calls :func:`patches.on_module_loaded` as SGLang's modules load.
- Newer SGLang (``sglang.srt.plugins`` entry points, ``SpeculativeAlgorithm.register``): the entry point
  :func:`entry_point.register` declared in pyproject.toml.

Pieces, one file each: ``patches`` (arguments, algorithm -> worker, registries), ``server_args_policy``
(what ``specpilot`` sets in ServerArgs), ``tree_tensors`` (DraftTree -> SGLang's tree tensors),
``draft_lattice`` (the standalone drafter's top-k steps -> our Lattice), ``worker`` (SpecPilotWorker),
``w12_method`` (QuantizationConfig / LinearMethod), ``w12_weights`` (W12 checkpoint names -> layer
parameters), ``hook_install`` (the ``.pth``).
"""

ALGORITHM = "SPECPILOT"
QUANT_METHOD = "w12"
