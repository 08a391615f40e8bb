"""`python -m warmshell` runs the CLI; `python -m warmshell supervisor` is the sandbox entry point."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "supervisor":
    # The supervisor starts in every sandbox: keep its import graph free of the CLI stack.
    from warmshell.supervisor.main import main as supervisor_main

    sys.exit(supervisor_main(sys.argv[2:]))

from warmshell.cli.main import main

main()
