"""The `rotvid` command line (typer). Commands are thin: they hand off to library functions.

One module per command (:mod:`~rotvid.cli.generate`, :mod:`~rotvid.cli.eval`, :mod:`~rotvid.cli.calibrate`,
:mod:`~rotvid.cli.backends`, :mod:`~rotvid.cli.build`, :mod:`~rotvid.cli.version`,
:mod:`~rotvid.cli.vbench_setup`), each registering itself on :data:`app`; the pieces they share in their own:
:mod:`~rotvid.cli.options` (the options and the checks of their values), :mod:`~rotvid.cli.request` (the request,
checked before loading), :mod:`~rotvid.cli.pipeline` (loading), :mod:`~rotvid.cli.workers` (--gpus),
:mod:`~rotvid.cli.progress` (the progress display) and :mod:`~rotvid.cli.errors`. The config of a run comes from
:meth:`rotvid.pipelines.RotvidConfig.from_options`.

Bad input (a missing file, an unknown model or variant, videos that do not match, an output that
exists) ends with one line on stderr, ``Error: ...``, and exit code 1 — never a traceback.
"""

from rotvid.cli.app import DEFAULT_MODEL, app
# each command module registers its command on app, in the order `rotvid --help` lists them
from rotvid.cli import version, backends, build, generate, eval, calibrate, vbench_setup  # noqa: F401, E402, I001

__all__ = ["app", "DEFAULT_MODEL"]
