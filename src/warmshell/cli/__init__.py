"""The `warmshell` command line (typer + rich); see warmshell.cli.main for the exit codes."""
