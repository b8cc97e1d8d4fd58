"""The fuse API's override body (pydantic); the notification's is
:class:`fusebox.fuse.intake.webhook.WebhookPayload`.

Strings the fuse stores or answers hold no lone surrogate (:data:`~fusebox.fuse.intake.webhook.Text`);
label values are capped at :data:`fusebox.fuse.intake.webhook.MAX_LABEL_VALUE` characters.
"""

# No `from __future__ import annotations`: FastAPI and pydantic read these annotations.

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..intake.webhook import LabelValue, Text

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
