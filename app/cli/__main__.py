"""``python -m keepstep.app.cli`` — the same as the ``keepstep`` console script."""

from keepstep.app.cli.main import main

main()
