"""Dead letters: rejected input, ``pg.dlq.<service>``."""

from __future__ import annotations

import base64
from typing import Literal

from pydantic import Field

from .envelope import Data, Envelope
from .subjects import Subjects

DLQ_PAYLOAD_LIMIT = 4096


class DeadLetterData(Data):
    service: str
    subject: str = Field(description="Subject the rejected message arrived on")
    error: str
    error_type: str
    deliveries: int | None = Field(default=None, description="Delivery attempts before giving up")
    payload: str = Field(description="The first bytes of the payload")
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    payload_size: int = Field(ge=0)
    truncated: bool = False

    @classmethod
    def capture(
        cls,
        *,
        service: str,
        subject: str,
        payload: bytes,
        error: BaseException | str,
        deliveries: int | None = None,
        limit: int = DLQ_PAYLOAD_LIMIT,
    ) -> DeadLetterData:
        head = payload[:limit]
        try:
            text, enc = head.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, enc = base64.b64encode(head).decode(), "base64"
        return cls(
            service=service,
            subject=subject,
            error=str(error),
            error_type=type(error).__name__ if isinstance(error, BaseException) else "Error",
            deliveries=deliveries,
            payload=text,
            payload_encoding=enc,
            payload_size=len(payload),
            truncated=len(payload) > limit,
        )


class DeadLetter(Envelope):
    type: Literal["io.powerguard.dlq.v1.dead_letter"] = "io.powerguard.dlq.v1.dead_letter"
    data: DeadLetterData
    SUBJECT_TEMPLATE = "{prefix}.dlq.{service}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.dlq(self.data.service)
