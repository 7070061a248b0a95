"""What config says about one repository's tasks, read from git: a repository's own ``.agent/config.yaml`` at a
task's base commit (never from a worktree a lane wrote), and the gaps that keep a task config-blocked. The parser
(``agent.config``) reads no git; this module does."""

from __future__ import annotations

from pathlib import Path

from agent.config import FIXER_ROLES, Config, ConfigError, RepoSettings, parse_repo_settings


def task_gaps(config: Config, home: Path, task: dict) -> list[str]:
    """What the config lacks for a task (``repo``, ``base_sha``): ``repos.<repo>`` and ``lanes.<role>`` for each
    chain role set neither there nor in the repository's own .agent/config.yaml (at the task's base commit)."""
    repo = task["repo"]
    gaps = [] if repo in config.repos else [f"repos.{repo}"]
    missing = [r for r in FIXER_ROLES if r not in config.lanes]
    if missing and task.get("base_sha"):
        from agent.git.workspace import mirror_path

        try:
            own = load_repo_settings(mirror_path(home, repo), task["base_sha"]).lanes
        except ConfigError:
            own = {}
        missing = [r for r in missing if r not in own]
    return gaps + [f"lanes.{r}" for r in missing]


def check_open_tasks(config: Config, home: Path, tasks: list[dict], filename: str = "config.yaml") -> None:
    """Refuse a config that drops a repository or a lane that open tasks need, as invalid YAML is refused: one
    line naming what is missing and the tasks, and nothing runs (rather than gate-blocking every task)."""
    needed: dict[str, list[int]] = {}
    for t in tasks:
        for gap in task_gaps(config, home, t):
            needed.setdefault(gap, []).append(t["id"])
    if not needed:
        return
    parts = []
    for gap, ids in needed.items():
        shown = ", ".join(str(i) for i in ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        parts.append(f"{gap} (open task{'s' if len(ids) > 1 else ''} {shown})")
    raise ConfigError(f"{filename}: missing {'; '.join(parts)}, which open tasks need; put "
                      f"{'it' if len(parts) == 1 else 'them'} back (nothing ran)")


REPO_SETTINGS_PATH = ".agent/config.yaml"


def load_repo_settings(mirror: Path, base_sha: str | None) -> RepoSettings:
    """A repository's own ``.agent/config.yaml`` as it is in the BASE commit (never the task's worktree, which a
    lane can write: a lane must not be able to loosen its own checks, blocked paths or reviewers)."""
    from agent.infra.textio import decode, load_yaml
    from agent.git.workspace import read_base_file

    if not base_sha or not Path(mirror).exists():
        return RepoSettings()
    raw = read_base_file(Path(mirror), base_sha, REPO_SETTINGS_PATH, raw=True)
    if raw is None:
        return RepoSettings()
    filename = f"{REPO_SETTINGS_PATH} at {base_sha[:12]}"
    data = load_yaml(decode(raw, filename, error=ConfigError).text, filename, error=ConfigError)
    return parse_repo_settings(data, filename=filename)
