"""One module per CLI command: each parses nothing, calls the library, prints, returns an exit code."""
