"""``python -m rotvid.cli``: the `rotvid` command (the --gpus workers are started this way)."""

from rotvid.cli import app

app()
