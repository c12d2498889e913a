"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status.

Every failure a client can cause is raised as ``APIError``; framework errors (unknown route, wrong
method) and anything unexpected are turned into the same shape, so clients never see a bare traceback.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger("specpilot.server")


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def install_error_handlers(app: FastAPI, on_error=None) -> None:
    """Route every error through ``APIError``; ``on_error(status, reason)`` counts them (metrics)."""

    def reply(err: APIError) -> JSONResponse:
        if on_error is not None:
            on_error(err.status, err.code or err.type)
        return err.response()

    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError):
        return reply(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = (
            f"Invalid URL ({request.method} {request.url.path})" if exc.status_code in (404, 405) else str(exc.detail)
        )
        return reply(APIError(exc.status_code, message, code="method_not_allowed" if exc.status_code == 405 else None))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        return reply(APIError(400, str(exc.errors()[:1])))

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: ClientDisconnect):  # nobody is left to read it; counted, not logged
        return reply(APIError(499, "the client disconnected", code="client_disconnected"))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        log.exception("unexpected error while serving a request")
        return reply(APIError(500, f"internal error: {type(exc).__name__}", type="server_error"))
