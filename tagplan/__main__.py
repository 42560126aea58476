"""``python -m tagplan`` is the ``tagplan`` command."""

from tagplan.cli import main

main()
