"""Config files: the documented example parses; every mistake names file, key path and expectation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agent.config import ConfigError, load_config, parse_config
from agent.config.repo import load_repo_settings

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "config.md"

EXAMPLE = """
repos:
  acme/widgets:
    url: https://github.com/acme/widgets.git
    base: main
    forge: github
    services: [widgets-api]
    check: "python -m pytest -q"
    branch_prefix: "agent/fix-"
lanes:
  implementer: {vendor: codex, model: gpt-5-codex, timeout: 1800, repair: 2}
  reviewer:    {vendor: claude}
  decider:     {vendor: claude}
vendors:
  claude: {bin: claude, env: [ANTHROPIC_API_KEY]}
  in-house:
    command: ["python", "/opt/agent_x.py", "--spec", "{spec}"]
limits: {round_cap: 5, repair: 1, task_budget_usd: 3.0}
decide: {auto: false, min_count: 3, max_age_days: 14}
git: {author_name: agent, author_email: agent@localhost}
github: {api_url: https://api.github.com, token_env: GITHUB_TOKEN}
sources:
  - {kind: loki, url: "http://127.0.0.1:3100", query: '{app="widgets"}', service: widgets-api, auth_env: LOKI_TOKEN}
  - {kind: file, path: /var/log/widgets/*.log, service: widgets-api}
"""


def test_example_parses_into_typed_objects():
    cfg = parse_config(yaml.safe_load(EXAMPLE))
    repo = cfg.repos["acme/widgets"]
    assert repo.forge == "github" and repo.services == ("widgets-api",)
    assert cfg.repo_for_service("widgets-api") is repo
    assert cfg.lanes["implementer"].repair == 2 and cfg.lanes["reviewer"].vendor == "claude"
    assert cfg.vendors["in-house"].command[0] == "python"
    assert cfg.limits.round_cap == 5 and cfg.decide.min_count == 3
    assert cfg.sources[0].kind == "loki" and cfg.sources[1].path.endswith("*.log")


CONTRACT_EXAMPLE = Path(__file__).parent / "data" / "config-contract.yaml"


def test_contract_example_parses():
    """The config contract's example, kept in the repository (tests/data/config-contract.yaml) so a fresh clone
    runs this too; where the contract docs sit beside the checkout, the copy must still match them."""
    block = CONTRACT_EXAMPLE.read_text()
    cfg = parse_config(yaml.safe_load(block))
    assert "acme/widgets" in cfg.repos and "in-house" in cfg.vendors
    if SHARED.exists():
        assert re.search(r"```yaml\n(repos:.*?)```", SHARED.read_text(), re.S).group(1) == block, \
            f"{SHARED}'s example changed: copy it to {CONTRACT_EXAMPLE}"


def test_forges_timeout_forms():
    assert parse_config({}).forges.timeout == (10.0, 30.0)
    assert parse_config({"forges": {"timeout": {"read": 90}}}).forges.timeout == (10.0, 90.0)
    assert parse_config({"forges": {"timeout": [3, 45]}}).forges.timeout == (3.0, 45.0)
    assert parse_config({"forges": {"timeout": 20}}).forges.timeout == (20.0, 20.0)


def test_gitlab_and_gitea_sections():
    cfg = parse_config({"repos": {"grp/sub/widgets": {"url": "git@gl.example:grp/sub/widgets.git", "forge": "gitlab"},
                                  "acme/api": {"url": "https://git.example/acme/api.git", "forge": "gitea"}},
                        "gitlab": {"api_url": "https://gl.example/api/v4/", "token_env": "GL"},
                        "gitea": {"api_url": "https://git.example/sub/api/v1"}})
    assert cfg.repos["grp/sub/widgets"].forge == "gitlab" and cfg.gitlab.api_url == "https://gl.example/api/v4"
    assert (cfg.gitlab.token_env, cfg.gitea.token_env, cfg.gitea.wip_prefix) == ("GL", "GITEA_TOKEN", "WIP: ")
    defaults = parse_config({})
    assert defaults.gitlab.api_url == "https://gitlab.com/api/v4" and defaults.gitlab.token_env == "GITLAB_TOKEN"


@pytest.mark.parametrize("doc, message", [
    ({"limits": {"round_cap": "five"}}, 'config.yaml: limits.round_cap: expected an integer >= 1, got "five"'),
    ({"limits": {"repair": 4}}, "config.yaml: limits.repair: expected an integer from 0 to 3, got 4"),
    ({"limitz": {}}, "config.yaml: limitz: unknown key"),
    ({"repos": {"widgets": {"url": "x"}}}, "config.yaml: repos.widgets: expected a repository name OWNER/NAME"),
    ({"repos": {"a/b": {}}}, "config.yaml: repos.a/b.url: expected a non-empty string, got nothing"),
    ({"repos": {"a/b": {"url": "x", "forge": "bitbucket"}}},
     "config.yaml: repos.a/b.forge: expected one of github|gitlab|gitea|local"),
    ({"repos": {"a/b/c": {"url": "x", "forge": "gitea"}}}, "config.yaml: repos.a/b/c: expected a repository name"),
    ({"repos": {"a//c": {"url": "x", "forge": "gitlab"}}}, "config.yaml: repos.a//c: expected a repository name "
                                                           "OWNER/NAME (GitLab: GROUP[/SUBGROUP...]/NAME)"),
    ({"repos": {"acme/../etc": {"url": "x", "forge": "gitlab"}}}, "config.yaml: repos.acme/../etc: expected a "
                                                                   "repository name OWNER/NAME (GitLab: GROUP"),
    ({"repos": {"acme/wid gets": {"url": "x", "forge": "github"}}}, "config.yaml: repos.acme/wid gets: expected a "
                                                                    "repository name OWNER/NAME, got the segment"),
    ({"gitlab": {"api_url": "gitlab.example.com"}}, "config.yaml: gitlab.api_url: expected an http(s) URL"),
    ({"forges": {"timeout": {"connect": 0}}}, "config.yaml: forges.timeout.connect: expected seconds, a number above 0"),
    ({"forges": {"timeout": "slow"}}, "config.yaml: forges.timeout.connect: expected seconds"),
    ({"forges": {"timeout": {"write": 3}}}, "config.yaml: forges.timeout.write: unknown key"),
    ({"gitea": {"api_url": "https://bot:hunter2@git.example/api/v1"}}, "config.yaml: gitea.api_url: secrets never"),
    ({"gitea": {"token": "x"}}, "config.yaml: gitea.token: unknown key"),
    ({"lanes": {"implementer": {"vendor": "nope"}}}, "config.yaml: lanes.implementer.vendor: expected a built-in"),
    ({"lanes": {"tester": {"vendor": "codex"}}}, "config.yaml: lanes.tester: unknown role"),
    ({"vendors": {"mine": {"bin": "x"}}}, "config.yaml: vendors.mine.command: expected an argv list"),
    ({"sources": [{"kind": "loki", "url": "http://x"}]}, "config.yaml: sources[0].query: expected a non-empty"),
    ({"decide": {"auto": "yes"}}, 'config.yaml: decide.auto: expected true or false, got "yes"'),
])
def test_errors_name_file_key_and_expectation(doc, message):
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    assert str(exc.value).startswith(message), str(exc.value)
    assert "\n" not in str(exc.value)


def test_bad_yaml_and_missing_required_file(tmp_path):
    bad = tmp_path / "config.yaml"
    bad.write_text("repos: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml", required=True)
    assert load_config(tmp_path / "missing.yaml").repos == {}


def test_parsed_config_is_cached_by_its_text(tmp_path, monkeypatch):
    """Issue 34: the home keeps the config's parsed YAML as JSON under its text's hash; a later process that reads
    the same text skips the YAML parser, an edited file (whatever its mtime) is parsed again, and a document JSON
    would change (a date, a number as a key) or a cache that is a link is never used."""
    import os

    from agent.infra import textio

    path, cache = tmp_path / "config.yaml", tmp_path / "config.yaml.json"
    path.write_text(EXAMPLE)
    first = load_config(path, cache=cache)
    assert cache.is_file() and oct(cache.stat().st_mode & 0o777) == "0o600"
    parsed = []
    real = textio.load_yaml
    monkeypatch.setattr(textio, "load_yaml", lambda *a, **k: parsed.append(1) or real(*a, **k))
    again = load_config(path, cache=cache)
    assert parsed == [] and again.lanes == first.lanes and again.vendors == first.vendors

    stat = path.stat()
    path.write_text(EXAMPLE.replace("round_cap: 5", "round_cap: 7"))     # the same size, the same mtime
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_config(path, cache=cache).limits.round_cap == 7 and parsed == [1]
    assert load_config(path, cache=cache).limits.round_cap == 7 and parsed == [1]

    for text in ("decide: {auto: false}\nwhen: 2026-12-04\n", "limits: {round_cap: 5}\n9: nine\n"):
        weird = tmp_path / "weird.yaml"
        weird.write_text(text)
        before = cache.read_text()
        assert textio.load_yaml_cached(text, "weird.yaml", cache) == yaml.safe_load(text)
        assert cache.read_text() == before                       # not kept: JSON would change it

    target = tmp_path / "elsewhere.json"
    target.write_text(cache.read_text())
    kept = target.read_text()
    cache.unlink()
    cache.symlink_to(target)
    parsed.clear()
    assert load_config(path, cache=cache).limits.round_cap == 7 and parsed == [1]    # a link is not read
    assert not cache.is_symlink() and target.read_text() == kept                     # nor written through


def test_the_home_keeps_its_config_parsed(tmp_path):
    """An App's config is read through the home's cache (``agent.config.CONFIG_CACHE``)."""
    from agent.app.context import App
    from agent.config import CONFIG_CACHE

    (tmp_path / "config.yaml").write_text(EXAMPLE)
    assert App(home=tmp_path).config.limits.round_cap == 5
    assert (tmp_path / CONFIG_CACHE).is_file()
    assert App(home=tmp_path).config.limits.round_cap == 5
    (tmp_path / CONFIG_CACHE).unlink()
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "agent.yaml").write_text(EXAMPLE)        # a --config file's text is not copied into the home
    assert App(home=tmp_path, config_file=other / "agent.yaml").config.limits.round_cap == 5
    assert not (tmp_path / CONFIG_CACHE).exists()


def _commit_all(repo: Path) -> str:
    import subprocess

    run = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", *a], cwd=repo,  # noqa
                                    check=True, capture_output=True, text=True).stdout.strip()
    run("add", "-A")
    run("commit", "-qm", "c")
    return run("rev-parse", "HEAD")


def test_repo_settings_come_from_the_base_commit(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q", "-b", "main", str(tmp_path)], check=True)
    (tmp_path / ".agent").mkdir()
    (tmp_path / ".agent" / "config.yaml").write_text(
        'check: "pytest -q"\nblocked_paths: [".github/"]\nlanes: {implementer: {vendor: claude}}\n')
    base = _commit_all(tmp_path)
    # what a lane would write into the worktree: never read
    (tmp_path / ".agent" / "config.yaml").write_text('check: "true"\nblocked_paths: []\n')
    s = load_repo_settings(tmp_path / ".git", base)
    assert s.check == "pytest -q" and s.blocked_paths == (".github/",) and s.lanes["implementer"].vendor == "claude"
    bad = _commit_all(tmp_path) if (tmp_path / ".agent" / "config.yaml").write_text("check: 5\n") else None
    with pytest.raises(ConfigError, match=r"\.agent/config.yaml at [0-9a-f]{12}: check: expected a non-empty "
                                          r"string, got 5"):
        load_repo_settings(tmp_path / ".git", bad)
    assert load_repo_settings(tmp_path / ".git", None).check is None


def test_this_repository_has_its_own_repo_settings():
    import subprocess

    from agent.git.workspace import find_common_dir

    root = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    s = load_repo_settings(find_common_dir(root), head)
    assert s.check and ".github/" in s.blocked_paths


def test_bad_config_stops_commands_with_exit_1(agent, home):
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("limits: {round_cap: five}\n")
    r = agent("task", "create", "--repo", "a/b", "--title", "t")
    assert r.exit_code == 1 and "limits.round_cap: expected an integer" in r.stderr
    r = agent("task", "list", "--json")
    assert r.exit_code == 0  # reading the ledger does not need the config
