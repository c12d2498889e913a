"""What ``--speculative-algorithm specpilot`` means for ServerArgs (SGLang 0.5.x).

SpecPilot runs SGLang's standalone-draft flow with a different tree builder, so it takes every decision
SGLang makes for STANDALONE (max running requests, mixed chunk off, page size / backend checks) by running
SGLang's own handler under the STANDALONE name, then restores its name and pins what our worker needs:
the non-overlap (V1) scheduler, because the worker is a V1 ``StandaloneWorker``.
"""

from __future__ import annotations

from sglang_specpilot.sglang_plugin import ALGORITHM

# (speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens) when none is given: SGLang's
# own EAGLE defaults for Llama (5, 4, 8). Not tuned for best-first trees yet (no GPU run of SGLang here).
DEFAULT_TREE = (5, 4, 8)


def profile_tree(path: str | None = None) -> tuple[int, int, int] | None:
    """(steps, topk, num_draft_tokens) of the tuned profile at ``path`` (default: ``SPECPILOT_PROFILE``), or
    None when there is none or it tunes no draft shape. The engine's tree (budget N, depth D, top-k K) is
    SGLang's (D, K, N + 1): SGLang's count includes the root; a chain of gamma is (gamma, 1, gamma + 1)."""
    from sglang_specpilot.controller.tune_profile import env_profile, read

    path = path or env_profile()
    if path is None:
        return None
    delta = read(path)["delta"]
    if delta.get("tree_depth") or delta.get("tree_budget") or delta.get("tree_top_k"):
        depth, top_k = delta.get("tree_depth") or DEFAULT_TREE[0], delta.get("tree_top_k") or 1
        return depth, top_k, (delta.get("tree_budget") or depth) + 1
    if delta.get("num_speculative_tokens"):
        g = delta["num_speculative_tokens"]
        return g, 1, g + 1
    return None


def is_specpilot(name: str | None) -> bool:
    return name is not None and name.upper() == ALGORITHM


def apply_defaults(args) -> None:
    """Normalize the name and fill the tree shape; raise ValueError on what the worker cannot run."""
    args.speculative_algorithm = ALGORITHM
    if args.speculative_draft_model_path is None:
        raise ValueError(
            "--speculative-algorithm specpilot drafts with a standalone model: pass --speculative-draft-model-path"
        )
    given = (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
    # A tuned profile (``specpilot tune``; SPECPILOT_PROFILE, inherited by SGLang's worker processes) fills
    # what the command line leaves unset; flags given on the command line win.
    defaults = profile_tree() or DEFAULT_TREE
    filled = tuple(d if g is None else g for g, d in zip(given, defaults, strict=True))
    steps, topk, n = filled
    if steps < 1 or topk < 1:
        raise ValueError(f"specpilot needs speculative_num_steps >= 1 and topk >= 1, got {steps}, {topk}")
    # N counts the root (the last verified token); the tree's other N - 1 nodes come from the lattice of
    # 1 + (steps - 1) * topk expansions of topk children each.
    lattice = topk + (steps - 1) * topk * topk
    if not 2 <= n <= lattice + 1:
        raise ValueError(f"speculative_num_draft_tokens must be in 2..{lattice + 1} for this lattice, got {n}")
    (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) = filled


def handle_speculative_decoding(args, original) -> None:
    """Wraps ``ServerArgs._handle_speculative_decoding`` (``original``) for the specpilot name."""
    if not is_specpilot(args.speculative_algorithm):
        original(args)
        return
    apply_defaults(args)
    args.speculative_algorithm = "STANDALONE"
    try:
        original(args)
    finally:
        args.speculative_algorithm = ALGORITHM
    args.disable_overlap_schedule = True
