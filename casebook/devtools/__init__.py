"""Tools for working on casebook itself, not for reading or running a book."""
