"""Reply bodies in OpenAI's shapes: completions, chat completions, their stream chunks, and SSE framing."""

from __future__ import annotations

import json
import time
import uuid

from ..engine.request import Request


class Reply:
    """The fields every object of one response shares (id, created, model) and its usage."""

    def __init__(self, kind: str, model: str, requests: list[Request]):
        self.chat = kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.requests = requests

    def usage(self) -> dict:
        prompt = sum(len(r.prompt) for r in self.requests)
        completion = sum(len(r.ids) for r in self.requests)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _head(self, chunk: bool) -> dict:
        obj = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, texts: list[str], reasons: list[str]) -> dict:
        choices = []
        for i, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
            if self.chat:
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": reason,
                    }
                )
            else:
                choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": reason})
        return {**self._head(False), "choices": choices, "usage": self.usage()}

    def chunk(
        self, index: int, text: str | None, reason: str | None = None, role: bool = False, include_usage: bool = False
    ) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": reason}
        out = {**self._head(True), "choices": [choice]}
        if include_usage:  # OpenAI: usage is null on every chunk but the last when include_usage is set
            out["usage"] = None
        return out

    def usage_chunk(self) -> dict:
        return {**self._head(True), "choices": [], "usage": self.usage()}


def sse(obj: dict | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line (``[DONE]`` is sent as-is)."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"
