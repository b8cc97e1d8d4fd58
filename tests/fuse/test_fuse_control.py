"""The typed control call (fuse/control.py): its JSON is the gateway's control body, in the order the
service has always written it, and it reads back from an outbox row's payload."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fusebox.fuse.control import ControlCall

BODY = ('{"action": "freeze_admissions", "level": 1, "state": "trip", "reason": "GPUMemoryUtilizationHigh firing", '
        '"scope": {"cluster": "c1", "hw_id": "GPU-1"}, "decision_id": "0f3c"}')


def test_the_json_is_the_gateway_control_body_key_for_key_and_in_order():
    call = ControlCall(action="freeze_admissions", level=1, state="trip", scope={"cluster": "c1", "hw_id": "GPU-1"},
                       reason="GPUMemoryUtilizationHigh firing", decision_id="0f3c")
    assert json.dumps(call.to_json()) == BODY


def test_an_outbox_payload_reads_back_as_the_same_call():
    call = ControlCall.from_json(json.loads(BODY))
    assert call == ControlCall("freeze_admissions", 1, "trip", {"cluster": "c1", "hw_id": "GPU-1"},
                               "GPUMemoryUtilizationHigh firing", "0f3c")
    assert call.trip and json.dumps(call.to_json()) == BODY


def test_a_call_the_reconciler_compares_has_no_reason_or_id_until_queued():
    call = ControlCall.from_json({"action": "text_only_fallback", "level": 2, "state": "release", "scope": {"engine": "e0"}})
    assert (call.reason, call.decision_id, call.trip) == ("", "", False)
    queued = call.queued("level 2 (text_only_fallback) released on {engine=\"e0\"} but not seen", "d9")
    assert queued.to_json() == {"action": "text_only_fallback", "level": 2, "state": "release",
                                "reason": "level 2 (text_only_fallback) released on {engine=\"e0\"} but not seen",
                                "scope": {"engine": "e0"}, "decision_id": "d9"}
    assert call.decision_id == ""  # frozen: queued() made a new one
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.level = 3  # type: ignore[misc]


@pytest.mark.parametrize("doc,message", [
    ({"action": "a", "level": 1, "state": "open"}, "state 'open' is not trip or release"),
    ({"action": "a", "level": "1", "state": "trip"}, "level '1' is not an integer"),
    ({"action": "a", "level": True, "state": "trip"}, "level True is not an integer"),
    ({"action": "a", "level": 1, "state": "trip", "scope": ["c1"]}, "scope ['c1'] is not an object"),
])
def test_a_payload_that_is_not_a_control_call_is_refused_with_what_is_wrong(doc, message):
    with pytest.raises(ValueError, match="control call: " + message.replace("[", r"\[").replace("]", r"\]")):
        ControlCall.from_json(doc)
