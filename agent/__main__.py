"""The console script (``agent``) and ``python -m agent``: a lane run goes to the home's fork server when one
answers (agent.app.forkclient, before click or any other agent module is imported: ``import agent.cli.X`` would
import click first); everything else, and a lane run no server takes, runs here.

``python -m agent --forkserver HOME`` is how ``agent daemon`` starts that server (agent.cli.forkserver): this
module, which knows both, gives it the command line to run and what to import first.
"""

import os
import sys

# what a lane run imports, loaded once by the fork server (a child imports anything else itself, from disk)
PRELOAD = ("agent.cli", "agent.cli.common", "agent.cli.lane", "agent.app.context", "agent.config",
           "agent.ledger", "agent.ledger.lanes", "agent.ledger.tasks", "agent.ledger.leases", "agent.lanes.lane",
           "agent.lanes.builtin", "agent.lanes.vendors", "agent.lanes.sandbox", "agent.lanes.egress",
           "agent.lanes.seccomp", "agent.lanes.progress", "agent.lanes.files", "agent.lanes.report",
           "agent.infra.proc", "agent.infra.redact", "agent.infra.env", "agent.infra.shutdown",
           "agent.git.workspace", "agent.app.homedir", "agent.config.repo", "agent.domain.prices", "glob", "pwd",
           "ctypes")


def main() -> None:
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--forkserver":
        from pathlib import Path

        from agent.cli import main as cli_main
        from agent.cli.forkserver import serve

        sys.exit(serve(Path(args[1]), run=cli_main, preload=PRELOAD))
    from agent.app.forkclient import run_in_server

    try:
        code = run_in_server(args)
    except KeyboardInterrupt:       # before the server's child took the run (it ends with the connection)
        sys.stderr.write("Aborted.\n")
        sys.exit(1)
    if code is not None:
        # the server's child ran the command (and wrote its output itself): nothing here to finalize; an
        # interpreter's orderly exit costs ~2 ms
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    from agent.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
