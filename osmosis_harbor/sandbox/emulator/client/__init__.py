"""The emulator's client side: the ``sky.sandbox``-shaped calls over HTTP and the handles they return."""
