"""The `corral` command line. `main.app` is the entry point; each command has its module."""
