"""An API error as the API server returns it: a ``Status`` object with its HTTP code."""

from __future__ import annotations

from powerguard.schemas.errors import PowerGuardError


class ApiError(PowerGuardError):
    def __init__(self, code: int, reason: str, message: str, *, details: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        out = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def not_found(key: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{key} "{name}" not found', details={"name": name, "kind": key.split(".")[0]})


def conflict(key: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {key} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        details={"name": name, "kind": key.split(".")[0]},
    )
