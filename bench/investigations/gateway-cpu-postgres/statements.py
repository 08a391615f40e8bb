"""The statements each database of a Postgres server log ran, by kind, per row inserted: the
store traffic of each `replicas.py --parts cpu` run (every run has a database of its own, in the
order the runs went).

The log is the bench's server's `data/server.log` with statement logging on, set while the bench
runs (its server is `scripts/dev-postgres`'s, a superuser's):

    ALTER SYSTEM SET log_statement = 'all'; ALTER SYSTEM SET log_line_prefix = '%d|';
    SELECT pg_reload_conf();

    python statements.py server.log > results/<name>_statements.md
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

# What a statement is called in the table: the first of these its text starts with.
KINDS = (
    (
        "SELECT kind, id, name, workspace, resource_version, payload FROM objects WHERE kind = $1 AND id = $2",
        "read by id",
    ),
    (
        "SELECT kind, id, name, workspace, resource_version, payload FROM objects WHERE kind = $1 AND workspace",
        "read by name",
    ),
    ("SELECT kind, id, name, workspace, resource_version, payload FROM objects WHERE kind = $1 ORDER BY", "listing"),
    ("UPDATE objects", "update (compare-and-swap)"),
    ("INSERT INTO objects", "insert"),
    ("DELETE FROM objects", "delete"),
    ("SELECT pg_notify", "progress lines (NOTIFY)"),
)
_LINE = re.compile(r"^(t_[0-9a-f]+)\|LOG:  (?:execute [^:]*|statement): (.*)$")


def counts(log: Path) -> dict[str, collections.Counter[str]]:
    """Statements by kind, for each bench database (named `t_…`), in the order first seen."""
    found: dict[str, collections.Counter[str]] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        database, text = match.groups()
        kind = next((name for prefix, name in KINDS if text.startswith(prefix)), "other")
        found.setdefault(database, collections.Counter())[kind] += 1
    return found


def table(found: dict[str, collections.Counter[str]]) -> str:
    """A markdown table: a column per database, statements per row inserted (the creates, and three replica rows)."""
    databases = [d for d, c in found.items() if c["insert"]]
    text = "| statement | " + " | ".join(databases) + " |\n|---|" + "---|" * len(databases) + "\n"
    for kind in [name for _, name in KINDS] + ["other", "all"]:
        cells = []
        for database in databases:
            count = found[database]
            n = sum(count.values()) if kind == "all" else count[kind]
            cells.append(f"{n / count['insert']:.1f}")
        text += f"| {kind} | " + " | ".join(cells) + " |\n"
    inserted = " | ".join(str(found[d]["insert"]) for d in databases)
    return text + f"| (rows inserted: the creates and the three replicas) | {inserted} |\n"


if __name__ == "__main__":
    print(table(counts(Path(sys.argv[1]))))
