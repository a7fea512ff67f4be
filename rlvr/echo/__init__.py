"""ECHO, the auxiliary loss on observation tokens (the `echo` config group): `echo=none` (the default, `echo: null`)
or `echo=on` (rlvr/echo/echo.py)."""
