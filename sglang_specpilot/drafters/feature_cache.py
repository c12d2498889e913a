"""The target's features over the training rows, computed once and kept on the device.

Why. EAGLE-3 training runs the frozen target over every batch for two things: the features the drafter
reads (its low, middle and high layers) and the teacher's distribution. The target never changes, so
every pass after the first recomputes the same numbers: on the H200 (SmolLM2, 16 rows of 1,024 tokens,
62be095) the target pass and teacher took 46 ms of a 199 ms step, and a run makes about four passes over
its data. Keeping the outputs costs memory instead: per token the three feature layers plus the last
layer's output (4 x hidden in the model dtype; SmolLM2: 4.6 KB, 36 GB for the 7.85M tokens of the
62be095 drafter's data), so the cache is used only where it fits (``fits``); the H200 has 141 GB.
Measured there (4fb4ff5, same data): a 33.7 GiB cache, and the target pass 46 -> 8.8 ms a step (what is
left gathers the cached rows).

What is kept per row: ``[n, (len(feature_layers) + 1) * hidden]``, the row's n tokens (no padding): the
feature layers' outputs in layer order (what ``target_pass`` returns) and the last layer's output, whose
norm and head give the teacher's logits at the answer positions only (``teacher``), as the full pass
computes them. A batch gathers its rows and pads with zeros: padding is a segment of its own, which no
real position attends to or reads features from, so the drafter sees what the full pass would give it.
"""

from __future__ import annotations

import torch

from .train_eagle3 import Batch, Sequence, make_batch, target_pass, teacher_from_rows


def cache_bytes(target, rows: list[list[Sequence]], feature_layers: tuple[int, ...]) -> int:
    tokens = sum(len(s.ids) for r in rows for s in r)
    width = (len(feature_layers) + 1) * target.cfg.hidden_size
    return tokens * width * target.embed.weight.element_size()


def fits(target, rows, feature_layers, share: float = 0.5) -> bool:
    """Whether the cache takes at most ``share`` of the device's free memory (CUDA only: elsewhere the
    full pass is cheap next to everything else, and host memory is the tests')."""
    dev = target.embed.weight.device
    if dev.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(dev)
    return cache_bytes(target, rows, feature_layers) <= share * free


class FeatureCache:
    def __init__(self, target, rows: list[list[Sequence]], feature_layers: tuple[int, ...], batch: int = 16):
        self.target, self.feature_layers = target, tuple(feature_layers)
        last = target.cfg.num_layers - 1
        layers = tuple(sorted(set(self.feature_layers) | {last}))
        H = target.cfg.hidden_size
        # Columns of ``layers``' concatenation: the feature layers' (in layer order, as target_pass returns
        # them), then the last layer's.
        cols = [torch.arange(layers.index(i) * H, (layers.index(i) + 1) * H) for i in sorted(self.feature_layers)]
        cols.append(torch.arange(layers.index(last) * H, (layers.index(last) + 1) * H))
        pick = torch.cat(cols).to(target.embed.weight.device)
        self.rows: list[torch.Tensor] = []
        with torch.no_grad():
            for a in range(0, len(rows), batch):
                chunk = rows[a : a + batch]
                b = make_batch(chunk).to(target.embed.weight.device)
                _, feats = target_pass(target, b, layers)
                feats = feats.index_select(-1, pick)
                for i, r in enumerate(chunk):
                    self.rows.append(feats[i, : sum(len(s.ids) for s in r)].clone())
        self.width = pick.numel()

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.rows)

    def lookup(self, picked: list[int], b: Batch, d2t: torch.Tensor):
        """(features [B, S, F * hidden] for the drafter, the teacher at b's answer positions) of rows
        ``picked`` (indices of the rows the cache was built from, in b's order)."""
        B, S = b.tokens.shape
        H = self.target.cfg.hidden_size
        out = self.rows[picked[0]].new_zeros(B, S, self.width)
        for i, r in enumerate(picked):
            t = self.rows[r]
            out[i, : t.shape[0]] = t
        feats, last = out[..., :-H], out[..., -H:]
        rows = b.answer.flatten().nonzero()[:, 0]
        lg = self.target.lm_head(self.target.norm(last.flatten(0, 1)[rows]))
        return feats, teacher_from_rows(lg, rows, b, d2t)
