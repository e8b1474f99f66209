"""``python -m tuner.cli``: the ``fa-tune`` command."""

from tuner.cli import main

main()
