"""One step of an agent loop, as an agent framework would write it with the warmshell SDK:
take a warm sandbox, write the script the model produced into it, run it, read the file it
wrote, and give the sandbox back.

Run it next to a gateway (`warmshell gateway start --pools examples/pools`); it finds the gateway
the way the CLI does ($WARMSHELL_STATE_DIR or ~/.local/state/warmshell).
"""

from __future__ import annotations

import json
import sys

import warmshell

# What a model might have written for "sum the squares of 1..10 and save the answer".
SCRIPT = """\
import json
total = sum(i * i for i in range(1, 11))
with open("/workspace/answer.json", "w") as out:
    json.dump({"sum_of_squares": total}, out)
print("wrote /workspace/answer.json")
"""


def main() -> int:
    # The sandbox is deleted when the block ends, and by the gateway after 10 minutes at most.
    with warmshell.Client() as client, client.create(labels={"agent": "example"}, ttl_seconds=600) as sb:
        info = sb.last_info
        print(f"sandbox {sb.name}: {info.allocation.value}, Ready in {info.timeline.ready_ms:.1f} ms")

        wrote = sb.run(["sh", "-c", "cat > /workspace/task.py"], stdin=SCRIPT)
        if wrote.exit_code != 0:
            print(wrote.stderr.decode(), file=sys.stderr)
            return 1

        ran = sb.run(["python3", "/workspace/task.py"], timeout=30)
        print(ran.stdout.decode(), end="")
        if ran.exit_code != 0:
            print(f"the script failed ({ran.exit_code}):\n{ran.stderr.decode()}", file=sys.stderr)
            return 1

        answer = json.loads(sb.run(["cat", "/workspace/answer.json"]).stdout)
        print(f"answer: {answer['sum_of_squares']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
