"""`python -m warmshell` runs the CLI; `python -m warmshell supervisor` is the sandbox entry point and
`python -m warmshell install-agent DIR` a Kubernetes pod's init container."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "supervisor":
    # The supervisor starts in every sandbox: keep its import graph free of the CLI stack.
    from warmshell.supervisor.main import main as supervisor_main

    sys.exit(supervisor_main(sys.argv[2:]))

if len(sys.argv) > 1 and sys.argv[1] == "install-agent":
    from warmshell.drivers.local.runtime.agent.installing import main as install_main

    sys.exit(install_main(sys.argv[2:]))

from warmshell.cli.main import main

main()
