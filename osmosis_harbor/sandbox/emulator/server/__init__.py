"""The emulator's server side: the HTTP app, its state in Docker, its faults, and the process that runs it."""
