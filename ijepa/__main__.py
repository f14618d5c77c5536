"""``python -m ijepa`` is the ``ijepa`` command."""

from ijepa.cli import main

main()
