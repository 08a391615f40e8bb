"""A container program for the fork server tests: records what it sees to ``$PROBE_OUT``, then
exits with ``argv[1]`` or, with ``wait``, waits for SIGTERM, records it and exits 7."""

import json
import os
import signal
import sys


def main() -> None:
    with open("/etc/hosts") as hosts:
        hosts_text = hosts.read()
    seen = {
        "pid": os.getpid(),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "cwd": os.getcwd(),
        "argv": sys.argv[1:],
        "preloaded": "forkprobe" in sys.modules,
        "volume": os.path.isdir("/data"),
        "hosts": hosts_text,
        "env": {k: v for k, v in os.environ.items() if k.startswith("PROBE_")},
    }
    with open(os.environ["PROBE_OUT"] + ".tmp", "w") as out:
        json.dump(seen, out)
    os.rename(os.environ["PROBE_OUT"] + ".tmp", os.environ["PROBE_OUT"])
    if sys.argv[1] == "wait":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        signal.sigwait({signal.SIGTERM})
        with open(os.environ["PROBE_OUT"] + ".term", "w"):
            pass
        sys.exit(7)
    sys.exit(int(sys.argv[1]))


if __name__ == "__main__":
    main()
