"""The LLM proposer: asks a model through the real ``anthropic`` SDK (Messages API) which legal edits to time.

The controller decides; the model only chooses. Each call sends the round's step profile, its ceiling and
largest factor, the past candidates with their verdicts, every feedback code (the gates' and this proposer's
own refusals), and the enumerated legal edits by id. The answer is structured: the request forces one call of
the tool ``propose_edits`` whose input schema is ``{"edits": [edit id, ...], "rationale": str}``; a plain-text
answer is accepted only if it is that JSON object. Whatever is not an enumerated legal id is refused with a
feedback code, so a malformed or illegal answer costs no timing:

    malformed_json     the answer is not a JSON object (text that does not parse, no tool call)
    schema_violation   "edits" missing or not a list of strings
    illegal_edit       an id that is not among the legal edits this round
    duplicate_edit     an id given twice
    too_many           ids past the m asked for
    api_error          the request failed (network, HTTP status); the built-in proposer carries the round
    no_api_key         no ANTHROPIC_API_KEY and no base URL: the LLM proposer is skipped

Without a key or network the loop runs on the built-in proposer alone.
"""

from __future__ import annotations

import json
import os

TOOL = {
    "name": "propose_edits",
    "description": "Choose option edits for the controller to time against the current best, best first.",
    "input_schema": {
        "type": "object",
        "properties": {
            "edits": {"type": "array", "items": {"type": "string"}, "description": "ids from the legal list"},
            "rationale": {"type": "string"},
        },
        "required": ["edits"],
    },
}

SYSTEM = (
    "You are a proposer in SpecPilot's tuning loop for lossless speculative decoding. A controller times every "
    "edit you choose against the current best in paired runs and promotes it only if the 95% lower bound of its "
    "gain exceeds 1% plus twice the stock-vs-stock noise and token forcing shows no output change. Work on the "
    "largest factor of the ceiling. Choose only ids from the legal list; anything else is refused."
)


def _summary(ctx: dict, edits, m: int) -> str:
    prof, ceil = ctx["profile"], ctx["ceiling"]
    hist = [
        {
            "id": h["id"],
            "gain": round(h["timing"]["gain"], 4),
            "gain_low": round(h["timing"]["gain_low"], 4),
            "promoted": h["promoted"],
            "feedback": h["feedback"],
        }
        for h in ctx.get("history", [])
    ]
    doc = {
        "round": ctx["round"],
        "current_best_delta": ctx["best"],
        "profile_ms_per_round": {k: round(v, 4) for k, v in prof["categories_ms"].items()},
        "step_ms": prof["step_ms"],
        "ar_ms": prof["ar_ms"],
        "tau": prof["tau"],
        "tau_best_replayed": prof["tau_best"],
        "floors": prof.get("floors_note") or prof.get("floors_ms"),
        "ceiling": {"factors": ceil["factors"], "largest": ceil["largest"], "unavailable": ceil["unavailable"]},
        "history": hist,
        "your_past_feedback": ctx.get("llm_feedback", []),
        "legal_edits": [{"id": e.id, "factor": e.factor, "changes": e.changes} for e in edits],
        "choose_at_most": m,
    }
    return json.dumps(doc, default=str)


def parse_answer(message, legal_ids: set[str], m: int) -> tuple[list[str], list[dict]]:
    """Accepted edit ids and feedback codes from a Messages API response."""
    payload = None
    for block in message.content:
        if block.type == "tool_use" and block.name == TOOL["name"]:
            payload = block.input
            break
    if payload is None:
        text = "".join(getattr(b, "text", "") for b in message.content if b.type == "text").strip()
        try:
            payload = json.loads(text)
        except ValueError:
            return [], [{"code": "malformed_json", "detail": text[:200]}]
    if not isinstance(payload, dict):
        return [], [{"code": "malformed_json", "detail": repr(payload)[:200]}]
    ids = payload.get("edits")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return [], [{"code": "schema_violation", "detail": f"edits = {ids!r}"[:200]}]
    accepted, feedback = [], []
    for i in ids:
        if i not in legal_ids:
            feedback.append({"code": "illegal_edit", "edit": i})
        elif i in accepted:
            feedback.append({"code": "duplicate_edit", "edit": i})
        elif len(accepted) >= m:
            feedback.append({"code": "too_many", "edit": i})
        else:
            accepted.append(i)
    return accepted, feedback


class LLMProposer:
    name = "llm"

    def __init__(self, model: str = "claude-sonnet-4-5", *, base_url: str | None = None, api_key: str | None = None,
                 max_tokens: int = 1024, timeout: float = 60.0):  # fmt: skip
        self.model, self.max_tokens = model, max_tokens
        self.base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL")
        self.api_key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        self.timeout = timeout
        self._client = None

    def client(self):
        if self._client is None:
            import anthropic  # the agent extra: pip install 'sglang-specpilot[agent]'

            self._client = anthropic.Anthropic(
                api_key=self.api_key, base_url=self.base_url, timeout=self.timeout, max_retries=0
            )
        return self._client

    def propose(self, ctx: dict, edits, m: int) -> dict:
        """``{"accepted": [ids], "feedback": [codes], "rationale": str | None}``; never raises on a bad answer."""
        if not self.api_key:
            return {"accepted": [], "feedback": [{"code": "no_api_key"}], "rationale": None}
        try:
            msg = self.client().messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                system=SYSTEM,
                tools=[TOOL],
                tool_choice={"type": "tool", "name": TOOL["name"]},
                messages=[{"role": "user", "content": _summary(ctx, edits, m)}],
            )
        except Exception as e:  # the SDK's APIError family and transport errors: the round goes on without it
            return {"accepted": [], "feedback": [{"code": "api_error", "detail": str(e)[:200]}], "rationale": None}
        accepted, feedback = parse_answer(msg, {e.id for e in edits}, m)
        rationale = next((b.input.get("rationale") for b in msg.content if b.type == "tool_use"
                          and isinstance(b.input, dict)), None)  # fmt: skip
        return {"accepted": accepted, "feedback": feedback, "rationale": rationale}
