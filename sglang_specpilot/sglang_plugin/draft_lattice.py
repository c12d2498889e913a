"""The standalone drafter's top-k steps, read as a ``tree_verify.Lattice``.

SGLang's EAGLE/standalone draft loop (``select_top_k_tokens``) grows candidates step by step: step 0
expands the root into k children; each later step expands the k best frontier candidates (by path
probability) into k children each. That is a lattice of ``E = 1 + (steps - 1) * k`` expansions of k
children, and SGLang's flat candidate numbering (step 0: ids 0..k-1, step i: k + (i - 1) k^2 + j k + c)
is the lattice's ``e * k + c``. The parents SGLang records per step, concatenated without the last step
(as ``organize_draft_results`` does), are therefore the expansions' parents: -1 for the root, then
candidate ids.

Where EAGLE keeps the top N - 1 candidates in candidate-id order, ``best_first`` keeps the same top N - 1
by path score (log-probs summed instead of probabilities multiplied) in score order, parents first, with
a deterministic tie rule; the tree tensors then link better-scored siblings first.
"""

from __future__ import annotations

import torch

from tree_verify import DraftTree, Lattice, best_first


def lattice_from_steps(
    parents_list: list[torch.Tensor], token_list: list[torch.Tensor], edge_probs: list[torch.Tensor], topk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack the draft loop's per-step records into lattice tensors.

    Parameters
    ----------
    parents_list : per step, SGLang's parents (step 0: [B, k + 1] = -1, 0..k-1; step i: [B, k])
    token_list : per step, the children's tokens (step 0: [B, k]; step i: [B, k * k])
    edge_probs : per step, each child's draft probability given its parent, shaped like ``token_list``
    topk : k

    Returns
    -------
    parents [B, E] int64, tokens [B, E, k] int64, logprobs [B, E, k] float (E = 1 + (steps - 1) k)
    """
    B = token_list[0].shape[0]
    if len(parents_list) > 1:
        parents = torch.cat(parents_list[:-1], dim=1)
    else:
        parents = parents_list[0][:, :1]  # one step: only the root's expansion
    tokens = torch.cat(token_list, dim=1).reshape(B, -1, topk)
    probs = torch.cat([p.reshape(B, -1) for p in edge_probs], dim=1).reshape(B, -1, topk)
    # log(p) <= 0 for p <= 1; clamp guards a softmax that rounds a probability a hair above 1.
    return parents.to(torch.long), tokens.to(torch.long), torch.log(probs.float()).clamp(max=0.0)


def best_first_tree(parents: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor, num_nodes: int) -> DraftTree:
    """The best ``num_nodes`` candidates of the lattice as a batched DraftTree ([B, num_nodes] fields)."""
    return best_first(Lattice(parents, tokens, logprobs), num_nodes)
