from asyncspec.cli import entry

entry()
