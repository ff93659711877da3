"""Small helpers with no knowledge of RL: a change signal (``change_signal``),
bounded lists (``bounded``), Python-version shims (``compat``), supervised
background tasks (``supervision``), atomic JSON files (``jsonio``) and message
wording (``text``)."""
