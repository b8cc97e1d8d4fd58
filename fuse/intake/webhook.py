"""The webhook body as the fuse reads it: the one validation of an Alertmanager notification.

:class:`WebhookPayload` (pydantic) is what ``POST /alertmanager`` accepts (its answers for a body
that is not one are FastAPI's 400s); :func:`fusebox.fuse.intake.payload.notification` turns a
valid one into the typed intake objects. Strings the fuse stores or answers hold no lone
surrogate (:data:`Text`); label values are capped at :data:`MAX_LABEL_VALUE` characters where a
model says so (an alert's own labels are not: an alert over the cap is refused alone).
"""

# No `from __future__ import annotations`: FastAPI and pydantic read these annotations.

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

__all__ = ["WebhookPayload", "Alert", "Text", "LabelValue", "storable", "NOT_STORABLE", "MAX_LABEL_VALUE",
           "MAX_FINGERPRINT"]

# Longest label name or value of an alert (and of an override scope), characters. Host names are at
# most 253 characters (RFC 1035), GPU UUIDs 40; the cap bounds what one alert can make the state and
# the page hold. An alert over it is refused alone (:class:`fusebox.fuse.intake.payload.Refused`).
MAX_LABEL_VALUE = 256

# Why a string is refused by :func:`storable`, for error messages.
NOT_STORABLE = "not valid Unicode text (it holds a lone surrogate such as \\udfff, which UTF-8 cannot encode)"


def storable(text: str) -> bool:
    """Whether ``text`` can be stored and answered: encodable as UTF-8, i.e. no lone surrogate.

    JSON may carry ``"\\udfff"``, which Python decodes to a lone surrogate; SQLite, the status page
    and JSON answers then fail with UnicodeEncodeError, so such text is refused at the door.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Alertmanager's fingerprints are 16 hex digits.
MAX_FINGERPRINT = 64


def _storable(text: str) -> str:
    if not storable(text):
        raise ValueError(f"is {NOT_STORABLE}")
    return text


# Text the fuse stores or answers: no lone surrogate (JSON's "\udfff"), whatever pydantic's own
# str validation lets through (it differs between pydantic-core versions).
Text = Annotated[str, AfterValidator(_storable)]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_LABEL_VALUE), AfterValidator(_storable)]


class Alert(BaseModel):
    """One alert of a webhook notification (Alertmanager's ``template.Alert``)."""

    model_config = ConfigDict(extra="allow")
    status: Literal["firing", "resolved"] | None = Field(None, description="absent: derived from endsAt")
    # not capped here: an alert over the cap is refused alone (payload.Refused), the others are used
    labels: dict[Text, Text] = Field(description=f"strings; an alert with a name or value over {MAX_LABEL_VALUE} "
                                                 "characters is refused alone (the others are used)")
    annotations: dict[str, str] = {}
    startsAt: str = Field(description="RFC 3339")
    endsAt: str | None = Field(None, description="RFC 3339; Go's zero time or absent: no end known")
    generatorURL: str | None = None
    fingerprint: Annotated[Text, StringConstraints(max_length=MAX_FINGERPRINT)] | None = Field(
        None, description="absent: computed from the labels as Alertmanager does")


class WebhookPayload(BaseModel):
    """Alertmanager webhook payload, version 4 (older versions are accepted too)."""

    model_config = ConfigDict(extra="allow")
    version: str | int | None = "4"
    groupKey: str | int | None = None
    truncatedAlerts: int = Field(0, ge=0)
    status: Literal["firing", "resolved"] | None = None
    receiver: str | None = None
    groupLabels: dict[str, str] = {}
    commonLabels: dict[str, str] = {}
    commonAnnotations: dict[str, str] = {}
    externalURL: str | None = None
    alerts: list[Alert]
