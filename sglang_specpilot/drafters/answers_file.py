"""The target's answers as a file: generate once, train many times (``train-drafter --answers-out/-in``).

Why: on the H200 the target's answers cost as much as a training run (SmolLM2, 256 tokens: 10,100 greedy
answers in 85-109 s, sampled ones about 3x that while they ran eagerly), and a device call is limited to
ten minutes. Saved answers let one call answer and the next train, and let later sessions add answer sets
(another seed, more prompts) without answering the old prompts again.

Format (``torch.save`` of plain tensors, lists and strings, read back with ``weights_only=True``):
``format``, ``target`` (the model's name), ``vocab_size``, ``tokenizer`` (its fingerprint, or None),
``prompts`` (the prompt texts, or token-id lists for synthetic prompts), ``meta`` (how they were made),
and per sequence ``lengths``, ``prompt_len``, ``prompt_index``, ``answer`` (0 greedy, 1 sampled) with all
token ids concatenated in ``ids`` (uint16 for vocabularies up to 65,536, else int32).

Loading checks the format and that every file answers the same target (name, vocabulary, tokenizer), and
refuses evaluation text again (``check_training_prompts``): a file is data from outside the run. Files
merge by prompt text, so the same prompt in two files (greedy in one, sampled in another) is one prompt,
and the held-out split keeps all of its answers on one side.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .train import check_training_prompts

FORMAT = "specpilot-answers/1"
KINDS = ("greedy", "sampled")


def target_identity(engine) -> dict:
    """What must match between the target that answered and the one being distilled into a drafter."""
    tok = getattr(engine, "tokenizer", None)
    return {
        "target": engine.target.cfg.name,
        "vocab_size": int(engine.target.cfg.vocab_size),
        "tokenizer": getattr(tok, "fingerprint", None) if tok is not None else None,
    }


def save_answers(path: str | os.PathLike, seqs: list, prompts: list, identity: dict, meta: dict) -> dict:
    """Write ``seqs`` (``train_eagle3.Sequence``) with the ``prompts`` they index; returns what was written
    (less the tensors). The file is written beside its final name and renamed, so a cut call leaves none."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "format": FORMAT,
        **identity,
        "prompts": [p if isinstance(p, str) else [int(t) for t in p] for p in prompts],
        "meta": dict(meta),
        # uint16 where the vocabulary fits (SmolLM2's 49,152 does): half the bytes, so 16k prompts' greedy
        # and sampled answers (~10M tokens) fit one 16 MiB file back from the device.
        "ids": torch.tensor([t for s in seqs for t in s.ids], dtype=torch.int32).to(
            torch.uint16 if identity["vocab_size"] <= 65536 else torch.int32
        ),
        "lengths": torch.tensor([len(s.ids) for s in seqs], dtype=torch.int32),
        "prompt_len": torch.tensor([s.prompt_len for s in seqs], dtype=torch.int32),
        "prompt_index": torch.tensor([s.prompt_index for s in seqs], dtype=torch.int32),
        "answer": torch.tensor([KINDS.index(s.answer) for s in seqs], dtype=torch.int8),
    }
    tmp = path.with_name(path.name + ".part")
    torch.save(blob, tmp)
    os.replace(tmp, path)
    return {"path": str(path), "sequences": len(seqs), "prompts": len(prompts), **identity, "meta": dict(meta)}


def _read(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"--answers-in {path}: no such file")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: one line, not a pickle traceback
        first = (str(e).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"--answers-in {path}: not a readable answers file ({type(e).__name__}: {first})") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise ValueError(f"--answers-in {path}: not a {FORMAT} file")
    n = int(blob["lengths"].numel())
    parts = ("prompt_len", "prompt_index", "answer")
    if any(int(blob[k].numel()) != n for k in parts) or int(blob["lengths"].sum()) != int(blob["ids"].numel()):
        raise ValueError(f"--answers-in {path}: its sequence tables disagree (a damaged file)")
    if n and (int(blob["prompt_index"].max()) >= len(blob["prompts"]) or int(blob["prompt_index"].min()) < 0):
        raise ValueError(f"--answers-in {path}: a sequence names a prompt the file does not hold")
    return blob


def load_answers(paths: list[str | os.PathLike], identity: dict) -> tuple[list, list, list[dict]]:
    """(sequences, prompts, per-file descriptions) from answer files made for the target ``identity``."""
    from .train_eagle3 import Sequence

    if not paths:
        raise ValueError("--answers-in: no file given")
    seqs: list = []
    prompts: list = []
    where: dict = {}  # prompt (hashable) -> index in the merged list
    described: list[dict] = []
    for p in paths:
        path = Path(p)
        blob = _read(path)
        for key in ("target", "vocab_size", "tokenizer"):
            if blob.get(key) != identity.get(key):
                raise ValueError(
                    f"--answers-in {path}: answers of another target ({key} {blob.get(key)!r}, this one "
                    f"{identity.get(key)!r})"
                )
        check_training_prompts(blob["prompts"])  # never evaluation text, whoever wrote the file
        remap = []
        for q in blob["prompts"]:
            key = q if isinstance(q, str) else tuple(q)
            if key not in where:
                where[key] = len(prompts)
                prompts.append(q)
            remap.append(where[key])
        ids = blob["ids"].to(torch.int32).tolist()
        at = 0
        cols = zip(blob["lengths"].tolist(), blob["prompt_len"].tolist(), blob["prompt_index"].tolist(),
                   blob["answer"].tolist(), strict=True)  # fmt: skip
        for n, plen, pi, kind in cols:
            seqs.append(Sequence(tuple(ids[at : at + n]), plen, remap[pi], KINDS[kind]))
            at += n
        described.append({"file": path.name, "sequences": len(blob["lengths"]), **blob["meta"]})
    return seqs, prompts, described
