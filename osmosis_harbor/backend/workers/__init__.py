"""``HarborBackend(workers=N)``: trials in N worker processes, one front in the server's.

``front`` is the server process's half (admission, status, cancel, health, shutdown, routing,
a dead worker's reaping and restart), ``handle`` its view of one worker process, ``worker`` the
worker process itself, ``messages`` the wire between them, ``crossing`` what of the options can
cross into a worker (and the refusals of what cannot).
"""
