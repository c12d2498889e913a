"""The request bodies of /v1/completions and /v1/chat/completions, validated the way OpenAI does.

Types are strict, as OpenAI's are: ``"max_tokens": "3"`` or ``true``, ``"stream": "yes"`` and
``"temperature": "0"`` are refused, not coerced. Ranges are checked here, before anything reaches the
engine: a seed outside 0..2**63-1 or a top_k beyond the vocabulary would otherwise fail inside the prefill
that admits the request. Bodies are checked for nesting depth and for lone UTF-16 surrogates (valid JSON
escapes that no tokenizer can encode) before validation.

Unknown top-level fields are refused ("Unrecognized request argument supplied"), as OpenAI's API does.
Parameters OpenAI defines that the engine cannot honour (n > 1, logprobs, penalties, tools, ...) are
refused by name rather than silently ignored, so a client never gets output that is not what it asked
for. ``top_k`` and ``ignore_eos`` are accepted as the vLLM / SGLang extensions of the same names.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..engine import SamplingParams
from .errors import APIError

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_DEPTH = 32  # nesting of JSON arrays / objects; a chat body needs 5
MAX_SEED = 2**63 - 1
MIN_TEMPERATURE = 1e-5  # lower temperatures are greedy
MAX_INT = 2**31 - 1  # the bound of counts (top_k, n, best_of, ...) before the engine's own checks


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=MAX_INT)  # -1 or 0: off (vLLM spells "off" as -1); <= vocab
    n: int | None = Field(None, ge=1, le=MAX_INT)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool | None = False

    def refuse_unsupported(self) -> None:
        if (self.n or 1) > 1:
            raise APIError(400, "n > 1 is not supported; send n requests (they are batched)", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name} is not supported (only 0)", param=name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")

    def stop_list(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP:
            raise APIError(400, f"at most {MAX_STOP} stop sequences are allowed", param="stop")
        return stop

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(
                max_new_tokens=max_new_tokens,
                temperature=self._temperature(),
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=max(0, self.top_k or 0),
                seed=self.seed,
                stop=self.stop_list(),
                ignore_eos=bool(self.ignore_eos),
            )
        except ValueError as e:
            raise APIError(400, str(e)) from None

    def _temperature(self) -> float:
        """OpenAI's default is 1. Below ``MIN_TEMPERATURE`` the logits / temperature overflow to inf (NaN
        probabilities): such a temperature means greedy, as in vLLM."""
        t = 1.0 if self.temperature is None else self.temperature
        return 0.0 if t < MIN_TEMPERATURE else t

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = Field(None, le=MAX_INT)
    suffix: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise APIError(400, "echo is not supported", param="echo")
        if self.logprobs is not None:
            raise APIError(400, "logprobs are not supported", param="logprobs")
        if (self.best_of or 1) > 1:
            raise APIError(400, "best_of > 1 is not supported", param="best_of")
        if self.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Extra keys are ignored here: clients often send back an assistant message as they received it
    # (with refusal, annotations, ...), and those do not change the prompt.
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs or self.top_logprobs is not None:
            raise APIError(400, "logprobs are not supported", param="logprobs")
        for name in ("tools", "functions"):
            if getattr(self, name):
                raise APIError(400, f"{name} are not supported", param=name)
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none"):
                raise APIError(400, f"{name} is not supported", param=name)
        if self.response_format and self.response_format.get("type") != "text":
            raise APIError(400, "only response_format {'type': 'text'} is supported", param="response_format")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def parse_body(raw: bytes, schema: type[_Sampling]) -> _Sampling:
    """Decode and validate a JSON body; every problem becomes a 400 naming the offending parameter."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise APIError(400, f"the JSON body nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"We could not parse the JSON body of your request: {e}") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_json_tree(data)
    try:
        body = schema.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        # OpenAI names the top-level parameter; the full location goes into the message.
        param = str(err["loc"][0]) if err["loc"] else None
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise APIError(400, f"Unrecognized request argument supplied: {param}", param=param) from None
        if err["type"] == "missing":
            raise APIError(
                400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
            ) from None
        raise APIError(400, f"Invalid value for '{where}': {err['msg']}", param=param, code="invalid_value") from None
    body.refuse_unsupported()
    return body


def check_json_tree(data: Any) -> None:
    """Refuse bodies nested deeper than ``MAX_DEPTH`` and strings holding lone surrogates (iteratively:
    no recursion for a hostile client to exhaust)."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, str):
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError as e:
                    param = where.split(".", 1)[0].split("[", 1)[0] or None
                    raise APIError(
                        400,
                        f"Invalid value for '{where}': the string holds a lone surrogate "
                        f"({node[e.start]!r} at index {e.start}), which is not valid Unicode",
                        param=param,
                        code="invalid_value",
                    ) from None
            continue
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise APIError(400, f"the JSON body nests deeper than {MAX_DEPTH} levels", code="invalid_value")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for k, v in items:
                if isinstance(k, str):
                    stack.append((k, depth, where))  # keys too: they end up in messages and templates
                    stack.append((v, depth + 1, f"{where}.{k}" if where else k))
                else:
                    stack.append((v, depth + 1, f"{where}[{k}]"))
