"""The `warmshell` command line (argparse; rich only for the live status line on a terminal); see
warmshell.cli.main for the exit codes."""
