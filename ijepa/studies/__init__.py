"""Scripts that regenerate the measured tables in ``docs/`` (``python -m ijepa.studies.<name> --help``)."""
