from hetpart.cli.app import _entry

_entry()
