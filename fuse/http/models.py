"""The fuse API's request bodies (pydantic): an Alertmanager notification, an override.

Strings the fuse stores or answers hold no lone surrogate (:data:`Text`); label values are capped
at :data:`fusebox.fuse.intake.payload.MAX_LABEL_VALUE` characters.
"""

# No `from __future__ import annotations`: FastAPI and pydantic read these annotations.

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from ..intake.payload import MAX_LABEL_VALUE, NOT_STORABLE, storable

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


# An override lasts at most a week: longer, and it outlives the incident it was for.
MAX_OVERRIDE_S = 7 * 86400


class OverrideRequest(BaseModel):
    """Force a level of a scope tripped or released until ``expires_in_s`` seconds from now.

    Strict types: ``"level": true`` or ``"expires_in_s": "600"`` are refused, not coerced.
    """

    model_config = ConfigDict(extra="ignore", strict=True)
    scope: dict[Text, LabelValue] = Field(description="scope labels (cluster, host_name, instance, hw_id, engine)")
    level: int = Field(ge=1, le=99, description="the spec's fuse level: 1 freeze_admissions, 2 text_only_fallback, "
                                                "3 kv_cache_eviction")
    mode: Literal["trip", "release"]
    reason: Text = Field(min_length=1, max_length=1000, description="why, for the audit log")
    expires_in_s: float = Field(gt=0, le=MAX_OVERRIDE_S, description="seconds until the override ends (required)")
    fleet: bool = Field(False, description='true, with "scope": {}, to override every scope of the fleet at once')
    new_scope: bool = Field(False, description="true to trip a scope that is part of a known one as a scope of its own")
