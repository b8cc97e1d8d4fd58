"""From committed decisions to adapter calls: the outbox dispatch loop (:mod:`.dispatcher`), the
reconciler that queues a trip again when the target's own state differs (:mod:`.reconcile`), and
what the calls achieved per tripped level (:mod:`.applied`)."""
