"""``SpecPilotWorker``: SGLang's standalone-draft worker with best-first trees.

Everything but the tree is SGLang's ``StandaloneWorker`` (its own draft model, KV pools shared with the
target, draft CUDA graphs, ``verify`` with ``verify_tree_greedy`` / ``tree_speculative_sampling_target_only``,
draft extend after verify). Two methods change:

- ``draft_forward`` runs the same draft steps but returns the whole lattice (expansion parents, child
  tokens, edge log-probs) instead of EAGLE's top-(N - 1) selection; it is the function SGLang's draft CUDA
  graph captures, and the graph runner only needs it to return three batch-leading tensors.
- ``draft`` turns the lattice into a best-first tree (``tree_verify.best_first``) and the tree into SGLang's
  tree tensors (``tree_tensors.sglang_tree_tensors``) in place of ``build_tree_kernel_efficient``.

Verification needs ``speculative_num_steps`` >= tree depth (accept_index has steps + 1 columns): a lattice
grown in ``steps`` steps has depth <= steps, so this always holds.
"""

from __future__ import annotations

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglang.srt.speculative.spec_utils import fast_topk, select_top_k_tokens
from sglang.srt.speculative.standalone_worker import StandaloneWorker

from sglang_specpilot.sglang_plugin.draft_lattice import best_first_tree, lattice_from_steps
from sglang_specpilot.sglang_plugin.tree_tensors import sglang_tree_tensors


class SpecPilotWorker(StandaloneWorker):
    """A ``StandaloneWorker`` whose draft tree is the best-first tree of the drafter's lattice."""

    def draft_forward(self, forward_batch: ForwardBatch):
        spec_info = forward_batch.spec_info
        assert isinstance(spec_info, EagleDraftInput)
        topk_p, topk_index, hidden_states = spec_info.topk_p, spec_info.topk_index, spec_info.hidden_states
        if self.hot_token_id is not None:
            topk_index = self.hot_token_id[topk_index]
        steps, k = self.speculative_num_steps, self.topk
        bs = forward_batch.batch_size
        # KV slots were reserved per (request, branch, step); step i writes one slot per branch.
        out_cache_loc = forward_batch.out_cache_loc.reshape(bs, k, steps).permute(2, 0, 1).reshape(steps, -1)

        parents_list, token_list, edge_probs = [], [], []
        scores = None
        for i in range(steps):
            # topk_p here is each child's probability given its parent: the lattice's edge weight.
            edge_probs.append(topk_p)
            input_ids, hidden_states, scores, (_, tokens, parents) = select_top_k_tokens(
                i, topk_p, topk_index, hidden_states, scores, k
            )
            token_list.append(tokens)
            parents_list.append(parents)
            if i == steps - 1:
                break
            forward_batch.input_ids = input_ids
            forward_batch.out_cache_loc = out_cache_loc[i]
            forward_batch.positions.add_(1)
            forward_batch.attn_backend = self.draft_attn_backend.attn_backends[i]
            spec_info.hidden_states = hidden_states
            logits_output = self.draft_model_runner.forward(forward_batch, skip_attn_backend_init=True).logits_output
            probs = torch.softmax(logits_output.next_token_logits, dim=-1)
            topk_p, topk_index = fast_topk(probs, k, dim=-1)
            if self.hot_token_id is not None:
                topk_index = self.hot_token_id[topk_index]
            hidden_states = logits_output.hidden_states
        return lattice_from_steps(parents_list, token_list, edge_probs, k)

    def draft(self, batch):
        if batch.forward_mode.is_idle():
            self._draft_preprocess_idle(batch)
        else:
            self._draft_preprocess_decode(batch)
        spec_info = batch.spec_info
        assert isinstance(spec_info, EagleDraftInput)
        # As in SGLang's draft step: the draft model returns its last hidden state, k tokens per request.
        spec_info.capture_hidden_mode = CaptureHiddenMode.LAST
        spec_info.num_tokens_per_req = self.topk
        spec_info.num_tokens_for_logprob_per_req = self.topk
        batch.return_hidden_states = False

        model_worker_batch = batch.get_model_worker_batch()
        forward_batch = ForwardBatch.init_new(model_worker_batch, self.draft_model_runner)
        if self.cuda_graph_runner and self.cuda_graph_runner.can_run(forward_batch):
            lattice = self.cuda_graph_runner.replay(forward_batch)
        else:
            forward_batch.can_run_dp_cuda_graph = False
            if not forward_batch.forward_mode.is_idle() and self.speculative_num_steps > 1:
                self.draft_attn_backend.init_forward_metadata(forward_batch)
            lattice = self.draft_forward(forward_batch)

        N = self.speculative_num_draft_tokens
        if batch.forward_mode.is_idle():
            return EagleVerifyInput.create_idle_input(self.topk, self.speculative_num_steps, N)
        tree = best_first_tree(*lattice, num_nodes=N - 1)
        t = sglang_tree_tensors(tree, spec_info.verified_id, batch.seq_lens, forward_batch.seq_lens_cpu)
        return EagleVerifyInput(
            draft_token=t.draft_token,
            custom_mask=t.custom_mask,
            positions=t.positions,
            retrive_index=t.retrive_index,
            retrive_next_token=t.retrive_next_token,
            retrive_next_sibling=t.retrive_next_sibling,
            retrive_cum_len=None,
            spec_steps=self.speculative_num_steps,
            topk=self.topk,
            draft_token_num=N,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=forward_batch.seq_lens_sum,
            seq_lens_cpu=forward_batch.seq_lens_cpu,
        )
