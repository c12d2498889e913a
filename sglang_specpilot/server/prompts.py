"""Request bodies -> engine requests: tokenization, the chat template, max_tokens and the context check."""

from __future__ import annotations

from ..engine import Engine, RequestError
from ..engine.request import Request
from .errors import APIError
from .protocol import ChatCompletionRequest, CompletionRequest

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the context left


def completion_prompts(body: CompletionRequest, engine: Engine, max_prompts: int | None = None) -> list[list[int]]:
    """One token list per prompt: a string, a list of strings, token ids, or a list of token-id lists.

    More than ``max_prompts`` prompts in one call is a 400 (as OpenAI refuses more than 2,048): one call
    must not fill the queue ahead of everyone else."""
    p = body.prompt
    if isinstance(p, str):
        return [engine.tokenizer.encode(p)]
    if p and all(isinstance(x, int) for x in p):
        return [list(p)]
    if not p:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if max_prompts is not None and len(p) > max_prompts:
        raise APIError(
            400,
            f"at most {max_prompts} prompts are allowed in one request, got {len(p)} "
            "(specpilot serve --max-prompts-per-request)",
            param="prompt",
            code="too_many_prompts",
        )
    if all(isinstance(x, list) for x in p):
        return [list(x) for x in p]
    return [engine.tokenizer.encode(t) for t in p]


def chat_prompt(body: ChatCompletionRequest, engine: Engine) -> list[int]:
    """The messages rendered with the tokenizer's chat template (ending in the assistant's turn)."""
    tok = engine.tokenizer
    if getattr(tok, "chat_template", None) is None or not hasattr(tok, "apply_chat_template"):
        raise APIError(400, "this model has no chat template; use /v1/completions", param="messages")
    messages = []
    for m in body.messages:
        msg = {"role": m.role, "content": m.text()}
        if m.name:
            msg["name"] = m.name
        messages.append(msg)
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as e:  # templates raise their own errors (raise_exception) on unsupported conversations
        raise APIError(400, f"the chat template refused these messages: {e}", param="messages") from None
    return tok.encode(text)


def context_left(engine: Engine, n_prompt: int) -> int:
    """Tokens a prompt of ``n_prompt`` tokens may still generate (the engine's own reservation rule)."""
    return engine.options.max_seq_len - n_prompt - reserved_slots(engine)


def reserved_slots(engine: Engine) -> int:
    """Positions one round writes past a row's length (``Engine.reserved_slots``; gamma + 1 before it)."""
    fn = getattr(engine, "reserved_slots", None)
    return fn() if fn is not None else engine.gamma + 1


def build_request(engine: Engine, body, prompt: list[int], default_max: int | None) -> Request:
    """Validate one prompt against the context and the vocabulary and make the engine's request."""
    asked = body.requested_max_tokens()
    left = context_left(engine, len(prompt))
    max_new = asked if asked is not None else (default_max if default_max is not None else left)
    param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    vocab = engine.target.cfg.vocab_size
    if body.top_k is not None and body.top_k > vocab:
        raise APIError(
            400,
            f"Invalid value for 'top_k': {body.top_k} is larger than the vocabulary ({vocab} "
            "tokens); use -1 or 0 for no top-k",
            param="top_k",
            code="invalid_value",
        )
    if max_new > left or left < 1:
        raise APIError(
            400,
            f"This model's maximum context length is {engine.options.max_seq_len} tokens (with "
            f"{reserved_slots(engine)} reserved for speculation). However, you requested "
            f"{len(prompt) + max_new} tokens "
            f"({len(prompt)} in the prompt, {max_new} for the completion). Please reduce the prompt or max_tokens.",
            param=param,
            code="context_length_exceeded",
        )
    try:
        return engine.new_request(prompt, body.sampling(max_new))
    except RequestError as e:
        raise APIError(400, str(e), param=param) from None
