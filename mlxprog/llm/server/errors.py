"""The server's errors as its clients see them: :class:`APIError`, an HTTP
status with an OpenAI-style error body."""

from __future__ import annotations

from typing import Any

#: The ``Retry-After`` seconds of a 503 for a full queue.
RETRY_AFTER = 1
#: The ``code`` of the error a job gets when the server stops before its end.
SHUTTING_DOWN = "server_shutting_down"


class APIError(Exception):
    """A request answered with an OpenAI-style error body: ``status`` (4xx: the
    request's fault, 5xx: the server's), ``message``, the request field it is
    about (``param``), the error ``type`` and ``code``, and HTTP ``headers``
    its response carries (``Retry-After``, say)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.headers = dict(headers or {})
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        """``{"error": {message, type, param, code}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}
