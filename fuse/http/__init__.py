"""The fuse's HTTP face: the app factory (:mod:`.app`), the uvicorn server guard (:mod:`.server`),
auth dependencies (:mod:`.deps`), problem answers (:mod:`.errors`, :mod:`.handlers`), the request
models (:mod:`.models`), the routes (:mod:`.routes`) and the status page (:mod:`.status`,
``static/status.html``). It stands on :mod:`fusebox.fuse.service`; nothing below imports it."""
