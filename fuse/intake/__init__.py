"""From a webhook notification to decisions: the notification's typed form (:mod:`.payload`) and
the breaker that turns alerts, overrides and ticks into trip and release decisions (:mod:`.breaker`).
No I/O: the service commits what the breaker decides."""
