"""The runtime: one worker process and its parts — the role table, the process lifecycle,
``--processes N``, the health server, the embedded server, start-up checks and the watchdog."""
