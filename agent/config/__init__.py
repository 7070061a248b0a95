"""YAML config -> typed dataclasses, with errors naming file, key path and what was expected.

Two files are parsed here: the home config (``$AGENT_HOME/config.yaml`` or ``--config FILE``) and,
optionally, a target repository's ``.agent/config.yaml`` (read from git by ``agent.config.repo``).  Both are a
user-facing contract (see DESIGN.md "Config"): unknown keys and wrong types are errors and nothing runs.
Secrets never live here: config names environment variables instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.domain.names import BUILTIN_VENDORS, repo_key_problem
from agent.infra.shutdown import DEFAULT_GRACE_S
from agent.infra.textio import InputError

ROLES = ("implementer", "reviewer", "pr-quality", "pr-logic", "decider")
FIXER_ROLES = ("implementer", "reviewer", "pr-quality", "pr-logic")   # the roles every task's chain runs
FORGES = ("github", "gitlab", "gitea", "local")
SOURCE_KINDS = ("loki", "file", "sentry")
SANDBOXES = ("bwrap", "none")
NETWORKS = ("proxy", "none", "host")      # sandbox.network (agent.lanes.egress)
UNIX_SOCKETS = ("deny", "allow")           # sandbox.unix_sockets (agent.lanes.seccomp)
DEFAULT_BLOCKED = (".github/", ".agent/")


class ConfigError(InputError):
    """``config.yaml: limits.round_cap: expected an integer >= 1, got "five"``"""


@dataclass(frozen=True)
class RepoConfig:
    name: str                      # OWNER/NAME
    url: str
    base: str = "main"
    forge: str = "local"
    services: tuple[str, ...] = ()
    check: str | None = None
    branch_prefix: str = "agent/fix-"
    blocked_paths: tuple[str, ...] = (".github/", ".agent/")
    allow_bidi: bool = False       # a round whose change adds bidi control characters is rejected unless true


@dataclass(frozen=True)
class LaneConfig:
    role: str
    vendor: str
    model: str | None = None
    timeout: int | None = None     # seconds; None -> limits.lane_timeout
    repair: int | None = None      # 0-3; None -> limits.repair


@dataclass(frozen=True)
class VendorConfig:
    name: str
    bin: str | None = None
    env: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None   # a command vendor's argv template
    resume: tuple[str, ...] | None = None
    args: tuple[str, ...] = ()               # extra argv appended for a built-in vendor
    writable: tuple[str, ...] = ()           # paths the vendor must write besides the worktree (sandbox binds)
    hosts: tuple[str, ...] = ()              # HOST[:PORT] its lanes may reach through the egress proxy


@dataclass(frozen=True)
class Limits:
    round_cap: int = 5
    repair: int = 1
    lane_timeout: int = 1800
    check_timeout: int = 900
    task_budget_usd: float = 3.0
    daily_budget_usd: float = 50.0
    open_drafts_per_repo: int = 3
    prs_per_hour: int = 2
    task_wall_time: int = 4 * 3600
    workspace_failures: int = 3    # consecutive failures to make a task's mirror/worktree before it gate-blocks
    feedback_rounds: int = 3                 # rounds started by PR feedback or PR CI (they count to round_cap too)
    worktree_grace: int = 24 * 3600    # seconds a finished task's worktree is kept (merged/closed PR, failed)
    worktree_max_mb: int = 2048        # a worktree grown past this after a lane or check fails the round
    lane_tmp_mb: int = 1024            # size of a lane's private /tmp and of its private home (tmpfs, RAM)
    shutdown_grace: int = DEFAULT_GRACE_S   # seconds the first SIGINT/SIGTERM lets running lanes finish before stopping them


@dataclass(frozen=True)
class DecideConfig:
    auto: bool = False
    min_count: int = 3
    max_age_days: int = 14
    max_per_scan: int = 10        # decider lanes one scan runs at most (each under the daily budget)


@dataclass(frozen=True)
class FeedbackConfig:
    ci_wait: int = 3600                       # seconds a pushed head may have no CI result before that is reported
    ci_apps: tuple[str, ...] = ("github-actions",)   # GitHub Apps whose check runs count as the PR's CI


@dataclass(frozen=True)
class ReviewConfig:
    allowed_users: tuple[str, ...] = ()      # may steer a PR besides people with write access


@dataclass(frozen=True)
class GitConfig:
    author_name: str = "agent"
    author_email: str = "agent@localhost"


@dataclass(frozen=True)
class GithubConfig:
    api_url: str = "https://api.github.com"
    token_env: str = "GITHUB_TOKEN"
    token_command: tuple[str, ...] | None = None
    app_id: int | None = None                   # a GitHub App instead of a token: its id, and its private key
    private_key_file: str | None = None         # ... from a PEM file
    private_key_env: str | None = None          # ... or from the variable holding the PEM
    installation_id: int | None = None          # None: found from the repository

    @property
    def app(self) -> bool:
        return self.app_id is not None


@dataclass(frozen=True)
class GitlabConfig:
    api_url: str = "https://gitlab.com/api/v4"      # self-managed: https://HOST/api/v4
    token_env: str = "GITLAB_TOKEN"                 # sent as PRIVATE-TOKEN


@dataclass(frozen=True)
class GiteaConfig:
    api_url: str = "https://gitea.com/api/v1"       # Gitea or Forgejo: https://HOST[/sub]/api/v1
    token_env: str = "GITEA_TOKEN"                  # sent as Authorization: token
    wip_prefix: str = "WIP: "                       # one of the instance's WORK_IN_PROGRESS_PREFIXES


@dataclass(frozen=True)
class ForgesConfig:
    timeout: tuple[float, float] = (10.0, 30.0)     # (connect, read) seconds of every forge HTTP call


@dataclass(frozen=True)
class SourceConfig:
    kind: str
    service: str | None = None
    environment: str | None = None
    url: str | None = None
    query: str | None = None
    auth_env: str | None = None
    path: str | None = None
    org: str | None = None
    project: str | None = None
    token_env: str | None = None
    tenant: str | None = None      # Loki: X-Scope-OrgID for multi-tenant setups
    format: str = "auto"

    @property
    def key(self) -> str:
        """Stable identity of this source, used for its persisted cursor."""
        return "|".join(str(x or "") for x in (self.kind, self.url, self.query, self.path, self.org, self.project))


NOTIFY_KINDS = ("slack", "webhook", "email")
NOTIFY_EVENTS = ("gate-blocked", "failed", "pr-opened", "pr-merged", "pr-closed", "budget")  # = ledger.outbox.KINDS


@dataclass(frozen=True)
class NotifyChannel:
    kind: str                      # slack | webhook | email
    on: tuple[str, ...] = NOTIFY_EVENTS
    name: str | None = None        # a stable id; default: derived from kind and destination
    url: str | None = None         # slack/webhook: the URL, or
    url_env: str | None = None     # ... the variable holding it (a Slack webhook URL is itself a secret)
    secret_env: str | None = None  # webhook: HMAC-SHA256 key (X-Agent-Signature: sha256=<hex>)
    smtp: str | None = None        # email: host:port
    user_env: str | None = None
    password_env: str | None = None
    to: tuple[str, ...] = ()
    sender: str | None = None      # email From (key `from`); default: the SMTP user, else agent@localhost
    starttls: bool = True

    @property
    def id(self) -> str:
        """Stable across config edits that do not change where the channel sends."""
        if self.name:
            return self.name
        import hashlib

        where = "|".join((self.kind, self.url or "", self.url_env or "", self.smtp or "", ",".join(self.to)))
        return f"{self.kind}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class LessonsConfig:
    reviewers: bool = False        # reviewer specs carry accepted lessons too (default: implementers only)
    per_service: int = 5           # accepted lessons a spec carries for one service or error, newest first
    max_chars: int = 300           # a longer LESSON is refused


@dataclass(frozen=True)
class DsnProject:
    """``serve.dsn`` entry: a Sentry project id that unmodified SDKs send to, with its key and where errors go."""
    project: str                  # the number at the end of the DSN
    key_env: str                  # environment variable holding the DSN's public key
    service: str                  # the service the project's errors belong to (config maps it to a repo)
    repo: str | None = None       # a configured repo key, when the service alone does not name one


@dataclass(frozen=True)
class ServeConfig:
    events_secret_env: str = "AGENT_HOOK_SECRET"      # HMAC-SHA256 of the body, X-Agent-Signature: sha256=<hex>
    sentry_secret_env: str = "SENTRY_CLIENT_SECRET"   # Sentry-Hook-Signature
    alertmanager_token_env: str = "ALERTMANAGER_TOKEN"  # Authorization: Bearer <token>
    max_body_bytes: int = 1048576
    read_token_env: str | None = None                 # Authorization: Bearer <token> for /, /tasks/*, /metrics
    require_timestamp: bool = False                   # /hooks/events must carry a signed X-Agent-Timestamp
    replay_window: int = 300                          # seconds a signed hook timestamp may be off from now
    dsn: tuple[DsnProject, ...] = ()                  # Sentry ingest (/api/<project>/envelope/ and /store/)
    max_events_per_minute: int = 600                  # Sentry ingest: over it, 429 with Retry-After
    url: str | None = None                            # where SDKs reach `agent serve` (doctor prints DSNs with it)


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    repos: dict[str, RepoConfig] = field(default_factory=dict)
    lanes: dict[str, LaneConfig] = field(default_factory=dict)
    vendors: dict[str, VendorConfig] = field(default_factory=dict)
    limits: Limits = Limits()
    decide: DecideConfig = DecideConfig()
    git: GitConfig = GitConfig()
    github: GithubConfig = GithubConfig()
    gitlab: GitlabConfig = GitlabConfig()
    gitea: GiteaConfig = GiteaConfig()
    forges: ForgesConfig = ForgesConfig()
    sources: tuple[SourceConfig, ...] = ()
    review: ReviewConfig = ReviewConfig()
    feedback: FeedbackConfig = FeedbackConfig()
    sandbox: str = "bwrap"                   # bwrap | none (explicit; doctor warns)
    sandbox_explicit: bool = False           # whether the file said `sandbox:` at all
    sandbox_network: str = "proxy"           # sandbox.network: proxy | none | host (agent.lanes.egress)
    sandbox_allow_hosts: tuple[str, ...] = ()   # sandbox.allow_hosts: HOST[:PORT] every lane may reach
    sandbox_unix_sockets: str = "deny"       # sandbox.unix_sockets: deny (socket(AF_UNIX) fails in lanes) | allow
    prices: dict = field(default_factory=dict)     # name (model or vendor) -> lanes.prices.Price
    notify: tuple[NotifyChannel, ...] = ()
    serve: ServeConfig = ServeConfig()
    lessons: LessonsConfig = LessonsConfig()
    ledger_url: str | None = None            # ledger.url: a PostgreSQL ledger (AGENT_LEDGER_URL wins)

    def repo_for_service(self, service: str | None, hint: str | None = None) -> RepoConfig | None:
        """The repository whose ``services`` lists ``service``: only config maps a service to a repository. An
        event's own ``repo`` field (a Sentry tag, a JSONL field) is a ``hint`` that only picks among those."""
        serving = [repo for repo in self.repos.values() if service and service in repo.services]
        return next((r for r in serving if r.name == hint), serving[0] if serving else None)

    def lane(self, role: str, repo: "RepoSettings | None" = None) -> LaneConfig | None:
        if repo is not None and role in repo.lanes:
            return repo.lanes[role]
        return self.lanes.get(role)

    def vendor(self, name: str) -> VendorConfig:
        return self.vendors.get(name) or VendorConfig(name=name)


@dataclass(frozen=True)
class RepoSettings:
    """A target repository's own ``.agent/config.yaml``."""
    check: str | None = None
    blocked_paths: tuple[str, ...] = ()
    lanes: dict[str, LaneConfig] = field(default_factory=dict)
    proof: "ProofSettings" = field(default_factory=lambda: ProofSettings())


PROOF_MODES = ("required", "optional", "off")


@dataclass(frozen=True)
class ProofSettings:
    """``proof:`` in a repository's own config (DESIGN.md "The proof"): which paths are tests (globs; empty: the
    per-language defaults in ``agent.flows.proof``) and whether a round needs a test that fails on the base."""
    mode: str = "required"
    tests: tuple[str, ...] = ()


# --------------------------------------------------------------------------- validation


class Validator:
    """Walks a parsed YAML document, raising ConfigError with ``file: key.path: expected ...``."""

    def __init__(self, filename: str):
        self.filename = filename

    def fail(self, path: str, expected: str, got: Any) -> None:
        shown = f'"{got}"' if isinstance(got, str) else ("nothing" if got is None else repr(got))
        raise ConfigError(f"{self.filename}: {path}: expected {expected}, got {shown}")

    def mapping(self, value: Any, path: str, allowed: tuple[str, ...] | None = None) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, "a mapping", value)
        if allowed is not None:
            for key in value:
                if key not in allowed:
                    where = f"{path}.{key}" if path else str(key)
                    raise ConfigError(
                        f"{self.filename}: {where}: unknown key; expected one of {', '.join(allowed)}")
        return value

    def string(self, value: Any, path: str, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(path, "a non-empty string" if not choices else f"one of {'|'.join(choices)}", value)
        if choices and value not in choices:
            self.fail(path, f"one of {'|'.join(choices)}", value)
        return value

    def opt_string(self, value: Any, path: str) -> str | None:
        return None if value is None else self.string(value, path)

    def integer(self, value: Any, path: str, lo: int | None = None, hi: int | None = None) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok or (lo is not None and value < lo) or (hi is not None and value > hi):
            bound = f" >= {lo}" if lo is not None and hi is None else (f" from {lo} to {hi}" if hi is not None else "")
            self.fail(path, f"an integer{bound}", value)
        return value

    def number(self, value: Any, path: str, lo: float = 0.0) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < lo:
            self.fail(path, f"a number >= {lo:g}", value)
        return float(value)

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, "true or false", value)
        return value

    def strings(self, value: Any, path: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if not isinstance(value, list):
            self.fail(path, "a list of strings", value)
        return tuple(self.string(v, f"{path}[{i}]") for i, v in enumerate(value))

    def argv(self, value: Any, path: str) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not isinstance(value, list) or not value:
            self.fail(path, "a non-empty list of strings (an argv)", value)
        return self.strings(value, path)


def _lane(v: Validator, role: str, raw: Any, path: str) -> LaneConfig:
    if role not in ROLES:
        raise ConfigError(f"{v.filename}: {path}: unknown role; expected one of {', '.join(ROLES)}")
    if isinstance(raw, str):
        raw = {"vendor": raw}
    d = v.mapping(raw, path, ("vendor", "model", "timeout", "repair"))
    return LaneConfig(
        role=role,
        vendor=v.string(d.get("vendor"), f"{path}.vendor"),
        model=v.opt_string(d.get("model"), f"{path}.model"),
        timeout=None if d.get("timeout") is None else v.integer(d["timeout"], f"{path}.timeout", 1),
        repair=None if d.get("repair") is None else v.integer(d["repair"], f"{path}.repair", 0, 3),
    )


def _lanes(v: Validator, raw: Any, path: str) -> dict[str, LaneConfig]:
    return {role: _lane(v, role, spec, f"{path}.{role}" if path else role)
            for role, spec in v.mapping(raw, path).items()}


def parse_config(data: Any, filename: str = "config.yaml", path: Path | None = None) -> Config:
    """Validate ``data`` (a parsed config.yaml) into a ``Config``; the first problem is a ``ConfigError`` naming the
    file, the key's path, what was expected and what was found."""
    v = Validator(filename)
    top = v.mapping(data, "", ("repos", "lanes", "vendors", "limits", "decide", "git", "github", "gitlab", "gitea",
                               "forges", "sources", "review", "prices", "sandbox", "notify", "serve", "ledger",
                               "lessons", "feedback"))
    repos = _repos(v, top.get("repos"))       # sections in this order: the first problem found is the one reported
    lanes = _lanes(v, top.get("lanes"), "lanes")
    vendors = _vendors(v, top.get("vendors"), lanes)
    limits = _limits(v, top.get("limits"))
    review, feedback = _review(v, top.get("review")), _feedback(v, top.get("feedback"))
    decide, git = _decide(v, top.get("decide")), _git(v, top.get("git"))
    github, gitlab, gitea = _github(v, top.get("github")), _gitlab(v, top.get("gitlab")), _gitea(v, top.get("gitea"))
    sources = _sources(v, top.get("sources"))
    sandbox, network, allow_hosts, unix_sockets = _sandbox(v, top.get("sandbox", "bwrap"))
    prices = _prices(v, top.get("prices"))
    return Config(path=path, repos=repos, lanes=lanes, vendors=vendors, limits=limits, decide=decide,
                  git=git, github=github, gitlab=gitlab, gitea=gitea, sources=sources, prices=prices,
                  forges=_forges(v, top.get("forges")),
                  review=review, feedback=feedback, sandbox=sandbox, sandbox_explicit="sandbox" in top,
                  sandbox_network=network, sandbox_allow_hosts=allow_hosts, sandbox_unix_sockets=unix_sockets,
                  notify=_notify(v, top.get("notify")),
                  serve=_serve(v, top.get("serve"), repos),
                  lessons=_lessons(v, top.get("lessons")),
                  ledger_url=_ledger_url(v, top.get("ledger")))


def _repos(v: Validator, raw_repos: Any) -> dict[str, RepoConfig]:
    filename = v.filename
    repos: dict[str, RepoConfig] = {}
    for name, raw in v.mapping(raw_repos, "repos").items():
        p = f"repos.{name}"
        d = v.mapping(raw, p, ("url", "base", "forge", "services", "check", "branch_prefix", "blocked_paths",
                               "allow_bidi"))
        why = repo_key_problem(name, d.get("forge", "local") if isinstance(d.get("forge", "local"), str) else None)
        if why:
            raise ConfigError(f"{filename}: {p}: {why}")
        repos[name] = RepoConfig(
            name=name,
            url=v.string(d.get("url"), f"{p}.url"),
            base=v.string(d.get("base", "main"), f"{p}.base"),
            forge=v.string(d.get("forge", "local"), f"{p}.forge", FORGES),
            services=v.strings(d.get("services"), f"{p}.services"),
            check=v.opt_string(d.get("check"), f"{p}.check"),
            branch_prefix=v.string(d.get("branch_prefix", "agent/fix-"), f"{p}.branch_prefix"),
            blocked_paths=v.strings(d.get("blocked_paths", list(DEFAULT_BLOCKED)), f"{p}.blocked_paths"),
            allow_bidi=v.boolean(d.get("allow_bidi", False), f"{p}.allow_bidi"),
        )
    return repos


def _vendors(v: Validator, raw_vendors: Any, lanes: dict[str, LaneConfig]) -> dict[str, VendorConfig]:
    """The ``vendors:`` section, and every lane's vendor known (built in, or defined here with a command)."""
    filename = v.filename
    vendors: dict[str, VendorConfig] = {}
    for name, raw in v.mapping(raw_vendors, "vendors").items():
        p = f"vendors.{name}"
        d = v.mapping(raw, p, ("bin", "env", "command", "resume", "args", "writable", "hosts"))
        vendors[name] = VendorConfig(
            name=name,
            bin=v.opt_string(d.get("bin"), f"{p}.bin"),
            env=v.strings(d.get("env"), f"{p}.env"),
            command=v.argv(d.get("command"), f"{p}.command"),
            resume=v.argv(d.get("resume"), f"{p}.resume"),
            args=v.strings(d.get("args"), f"{p}.args"),
            writable=v.strings(d.get("writable"), f"{p}.writable"),
            hosts=_hosts(v, d.get("hosts"), f"{p}.hosts"),
        )
    for role, lane in lanes.items():
        if lane.vendor not in BUILTIN_VENDORS and lane.vendor not in vendors:
            raise ConfigError(
                f"{filename}: lanes.{role}.vendor: expected a built-in vendor ({', '.join(BUILTIN_VENDORS)}) "
                f'or one defined under vendors:, got "{lane.vendor}"')
    for name, vc in vendors.items():
        if name not in BUILTIN_VENDORS and vc.command is None:
            raise ConfigError(f"{filename}: vendors.{name}.command: expected an argv list for a command vendor, "
                              "got nothing")
    return vendors


def _limits(v: Validator, raw: Any) -> Limits:
    ld = v.mapping(raw, "limits", tuple(Limits.__dataclass_fields__))
    dflt = Limits()
    return Limits(
        round_cap=v.integer(ld.get("round_cap", dflt.round_cap), "limits.round_cap", 1),
        repair=v.integer(ld.get("repair", dflt.repair), "limits.repair", 0, 3),
        lane_timeout=v.integer(ld.get("lane_timeout", dflt.lane_timeout), "limits.lane_timeout", 1),
        check_timeout=v.integer(ld.get("check_timeout", dflt.check_timeout), "limits.check_timeout", 1),
        task_budget_usd=v.number(ld.get("task_budget_usd", dflt.task_budget_usd), "limits.task_budget_usd"),
        daily_budget_usd=v.number(ld.get("daily_budget_usd", dflt.daily_budget_usd), "limits.daily_budget_usd"),
        open_drafts_per_repo=v.integer(ld.get("open_drafts_per_repo", dflt.open_drafts_per_repo),
                                       "limits.open_drafts_per_repo", 1),
        prs_per_hour=v.integer(ld.get("prs_per_hour", dflt.prs_per_hour), "limits.prs_per_hour", 1),
        task_wall_time=v.integer(ld.get("task_wall_time", dflt.task_wall_time), "limits.task_wall_time", 1),
        workspace_failures=v.integer(ld.get("workspace_failures", dflt.workspace_failures),
                                     "limits.workspace_failures", 1),
        feedback_rounds=v.integer(ld.get("feedback_rounds", dflt.feedback_rounds), "limits.feedback_rounds", 0),
        worktree_grace=v.integer(ld.get("worktree_grace", dflt.worktree_grace), "limits.worktree_grace", 0),
        worktree_max_mb=v.integer(ld.get("worktree_max_mb", dflt.worktree_max_mb), "limits.worktree_max_mb", 1),
        lane_tmp_mb=v.integer(ld.get("lane_tmp_mb", dflt.lane_tmp_mb), "limits.lane_tmp_mb", 16),
        shutdown_grace=v.integer(ld.get("shutdown_grace", dflt.shutdown_grace), "limits.shutdown_grace", 0),
    )


def _review(v: Validator, raw: Any) -> ReviewConfig:
    rd = v.mapping(raw, "review", ("allowed_users",))
    return ReviewConfig(allowed_users=v.strings(rd.get("allowed_users"), "review.allowed_users"))


def _feedback(v: Validator, raw: Any) -> FeedbackConfig:
    fd = v.mapping(raw, "feedback", ("ci_wait", "ci_apps"))
    return FeedbackConfig(
        ci_wait=v.integer(fd.get("ci_wait", FeedbackConfig.ci_wait), "feedback.ci_wait", 1),
        ci_apps=v.strings(fd["ci_apps"], "feedback.ci_apps") if "ci_apps" in fd else FeedbackConfig.ci_apps)


def _decide(v: Validator, raw: Any) -> DecideConfig:
    dd = v.mapping(raw, "decide", ("auto", "min_count", "max_age_days", "max_per_scan"))
    return DecideConfig(
        auto=v.boolean(dd.get("auto", False), "decide.auto"),
        min_count=v.integer(dd.get("min_count", 3), "decide.min_count", 1),
        max_age_days=v.integer(dd.get("max_age_days", 14), "decide.max_age_days", 1),
        max_per_scan=v.integer(dd.get("max_per_scan", DecideConfig.max_per_scan), "decide.max_per_scan", 1),
    )


def _git(v: Validator, raw: Any) -> GitConfig:
    gd = v.mapping(raw, "git", ("author_name", "author_email"))
    return GitConfig(
        author_name=v.string(gd.get("author_name", "agent"), "git.author_name"),
        author_email=v.string(gd.get("author_email", "agent@localhost"), "git.author_email"),
    )


def _github(v: Validator, raw: Any) -> GithubConfig:
    """``github:``: the API, the token (or a command printing one), or a GitHub App (its id and exactly one key)."""
    filename = v.filename
    hd = v.mapping(raw, "github", tuple(GithubConfig.__dataclass_fields__))
    github = GithubConfig(
        api_url=v.string(hd.get("api_url", "https://api.github.com"), "github.api_url").rstrip("/"),
        token_env=v.string(hd.get("token_env", "GITHUB_TOKEN"), "github.token_env"),
        token_command=v.argv(hd.get("token_command"), "github.token_command"),
        app_id=None if hd.get("app_id") is None else v.integer(hd["app_id"], "github.app_id", 1),
        private_key_file=v.opt_string(hd.get("private_key_file"), "github.private_key_file"),
        private_key_env=v.opt_string(hd.get("private_key_env"), "github.private_key_env"),
        installation_id=(None if hd.get("installation_id") is None
                         else v.integer(hd["installation_id"], "github.installation_id", 1)),
    )
    keys = [k for k in ("private_key_file", "private_key_env") if hd.get(k) is not None]
    if github.app_id is not None and len(keys) != 1:
        raise ConfigError(f"{filename}: github.app_id: a GitHub App needs exactly one of github.private_key_file "
                          f"(a PEM file) or github.private_key_env (a variable holding the PEM), got "
                          f"{' and '.join(keys) or 'neither'}")
    for k in keys + (["installation_id"] if github.installation_id is not None else []):
        if github.app_id is None:
            raise ConfigError(f"{filename}: github.{k}: only used with github.app_id (a GitHub App); set app_id "
                              "or remove it")
    return github


def _gitlab(v: Validator, raw: Any) -> GitlabConfig:
    gl = v.mapping(raw, "gitlab", ("api_url", "token_env"))
    return GitlabConfig(
        api_url=_api_url(v, gl.get("api_url", GitlabConfig.api_url), "gitlab.api_url"),
        token_env=v.string(gl.get("token_env", GitlabConfig.token_env), "gitlab.token_env"),
    )


def _gitea(v: Validator, raw: Any) -> GiteaConfig:
    td = v.mapping(raw, "gitea", ("api_url", "token_env", "wip_prefix"))
    return GiteaConfig(
        api_url=_api_url(v, td.get("api_url", GiteaConfig.api_url), "gitea.api_url"),
        token_env=v.string(td.get("token_env", GiteaConfig.token_env), "gitea.token_env"),
        wip_prefix=v.string(td.get("wip_prefix", GiteaConfig.wip_prefix), "gitea.wip_prefix"),
    )


def _sources(v: Validator, raw_sources: Any) -> tuple[SourceConfig, ...]:
    """``sources:``: each with the keys its kind needs; a secret is never a value here, only a variable's name."""
    filename = v.filename
    sources = []
    raw_sources = raw_sources or []
    if not isinstance(raw_sources, list):
        v.fail("sources", "a list of sources", raw_sources)
    for i, raw in enumerate(raw_sources):
        p = f"sources[{i}]"
        d = v.mapping(raw, p, tuple(SourceConfig.__dataclass_fields__))
        kind = v.string(d.get("kind"), f"{p}.kind", SOURCE_KINDS)
        src = SourceConfig(kind=kind, **{k: v.opt_string(d.get(k), f"{p}.{k}")
                                         for k in SourceConfig.__dataclass_fields__
                                         if k not in ("kind", "format")},
                           format=v.string(d.get("format", "auto"), f"{p}.format",
                                           ("auto", "jsonl", "sentry", "traceback")))
        needed = {"loki": ("url", "query"), "file": ("path",), "sentry": ("url", "org", "project")}[kind]
        for k in needed:
            if getattr(src, k) is None:
                v.fail(f"{p}.{k}", f"a non-empty string (required for kind {kind})", None)
        if src.kind == "loki" and d.get("password") is not None:
            raise ConfigError(f"{filename}: {p}.password: secrets never go in config; name an env var in auth_env")
        sources.append(src)
    return tuple(sources)


def _prices(v: Validator, raw: Any) -> dict:
    """``prices:`` per model or vendor, USD per million input and output tokens."""
    prices = {}
    for name, entry in v.mapping(raw, "prices").items():
        from agent.domain.prices import Price

        p = f"prices.{name}"
        d = v.mapping(entry, p, ("input", "output"))
        for k in ("input", "output"):
            if k not in d:
                v.fail(f"{p}.{k}", "a number >= 0 (USD per million tokens)", None)
        prices[str(name)] = Price(input=v.number(d["input"], f"{p}.input"), output=v.number(d["output"], f"{p}.output"))
    return prices


def _sandbox(v: Validator, raw: Any) -> tuple[str, str, tuple[str, ...], str]:
    """``sandbox: bwrap|none``, or ``sandbox: {mode: bwrap|none, network: proxy|none|host, allow_hosts: [...],
    unix_sockets: deny|allow}``."""
    if isinstance(raw, str) or raw is None:
        return v.string(raw, "sandbox", SANDBOXES), "proxy", (), "deny"
    d = v.mapping(raw, "sandbox", ("mode", "network", "allow_hosts", "unix_sockets"))
    return (v.string(d.get("mode", "bwrap"), "sandbox.mode", SANDBOXES),
            v.string(d.get("network", "proxy"), "sandbox.network", NETWORKS),
            _hosts(v, d.get("allow_hosts"), "sandbox.allow_hosts"),
            v.string(d.get("unix_sockets", "deny"), "sandbox.unix_sockets", UNIX_SOCKETS))


def _hosts(v: Validator, raw: Any, path: str) -> tuple[str, ...]:
    """A list of ``HOST``, ``HOST:PORT`` or ``*.DOMAIN`` entries (the egress proxy's allowlist)."""
    from agent.domain.hosts import HostRule

    hosts = v.strings(raw, path)
    for h in hosts:
        try:
            HostRule.parse(h)
        except ValueError as exc:
            raise ConfigError(f"{v.filename}: {path}: expected HOST, HOST:PORT or *.DOMAIN, got \"{h}\" ({exc})")
    return hosts


def _ledger_url(v: Validator, raw: Any) -> str | None:
    """``ledger: {url: postgresql://USER@HOST[:PORT]/DB}``; the URL is never echoed with its password."""
    from agent.ledger.backend import BackendError, check_url

    d = v.mapping(raw, "ledger", ("url",))
    url = d.get("url")
    if url is None:
        return None
    if not isinstance(url, str) or not url.strip():
        v.fail("ledger.url", "a postgresql://USER@HOST[:PORT]/DB URL", url if not isinstance(url, str) else "")
    try:
        return check_url(url, f"{v.filename}: ledger.url")
    except BackendError as exc:
        raise ConfigError(str(exc)) from None


_CHANNEL_KEYS = ("kind", "name", "on", "url", "url_env", "secret_env", "smtp", "user_env", "password_env", "to",
                 "from", "starttls")


def _notify(v: Validator, raw: Any) -> tuple[NotifyChannel, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        v.fail("notify", "a list of channels", raw)
    channels: list[NotifyChannel] = []
    for i, item in enumerate(raw):
        p = f"notify[{i}]"
        for secret in ("secret", "password", "token"):
            if isinstance(item, dict) and item.get(secret) is not None:
                raise ConfigError(f"{v.filename}: {p}.{secret}: secrets never go in config; "
                                  f"name an environment variable in {secret}_env")
        if isinstance(item, dict) and True in item:  # YAML 1.1 reads a bare `on:` key as the boolean true
            item = {("on" if k is True else k): val for k, val in item.items()}
        d = v.mapping(item, p, _CHANNEL_KEYS)
        kind = v.string(d.get("kind"), f"{p}.kind", NOTIFY_KINDS)
        on = v.strings(d.get("on"), f"{p}.on") if d.get("on") is not None else NOTIFY_EVENTS
        for j, ev in enumerate(on):
            if ev not in NOTIFY_EVENTS:
                v.fail(f"{p}.on[{j}]", f"one of {'|'.join(NOTIFY_EVENTS)}", ev)
        ch = NotifyChannel(
            kind=kind, on=on, name=v.opt_string(d.get("name"), f"{p}.name"),
            url=v.opt_string(d.get("url"), f"{p}.url"), url_env=v.opt_string(d.get("url_env"), f"{p}.url_env"),
            secret_env=v.opt_string(d.get("secret_env"), f"{p}.secret_env"),
            smtp=v.opt_string(d.get("smtp"), f"{p}.smtp"),
            user_env=v.opt_string(d.get("user_env"), f"{p}.user_env"),
            password_env=v.opt_string(d.get("password_env"), f"{p}.password_env"),
            to=v.strings(d.get("to"), f"{p}.to"), sender=v.opt_string(d.get("from"), f"{p}.from"),
            starttls=v.boolean(d.get("starttls", True), f"{p}.starttls"))
        if kind in ("slack", "webhook"):
            if (ch.url is None) == (ch.url_env is None):
                v.fail(f"{p}.url", "exactly one of url or url_env (the variable holding the URL)",
                       None if ch.url is None else "both")
            if ch.url and not ch.url.startswith(("http://", "https://")):
                v.fail(f"{p}.url", "an http:// or https:// URL", ch.url)
        if kind == "webhook" and ch.secret_env is None:
            v.fail(f"{p}.secret_env", "the environment variable holding the HMAC key (a webhook is signed)", None)
        if kind == "email":
            host, _, port = (ch.smtp or "").rpartition(":")
            if not host or not port.isdigit():
                v.fail(f"{p}.smtp", "host:port of an SMTP server, e.g. smtp.example:587", ch.smtp)
            if not ch.to:
                v.fail(f"{p}.to", "a list of recipient addresses", None)
            if (ch.user_env is None) != (ch.password_env is None):
                v.fail(f"{p}.password_env" if ch.password_env is None else f"{p}.user_env",
                       "both user_env and password_env, or neither", None)
        if any(c.id == ch.id for c in channels):
            raise ConfigError(f"{v.filename}: {p}: same destination as another channel; give one a distinct name")
        channels.append(ch)
    return tuple(channels)


def _serve(v: Validator, raw: Any, repos: dict) -> ServeConfig:
    d = v.mapping(raw, "serve", tuple(ServeConfig.__dataclass_fields__))
    dflt = ServeConfig()
    return ServeConfig(
        events_secret_env=v.string(d.get("events_secret_env", dflt.events_secret_env), "serve.events_secret_env"),
        sentry_secret_env=v.string(d.get("sentry_secret_env", dflt.sentry_secret_env), "serve.sentry_secret_env"),
        alertmanager_token_env=v.string(d.get("alertmanager_token_env", dflt.alertmanager_token_env),
                                        "serve.alertmanager_token_env"),
        max_body_bytes=v.integer(d.get("max_body_bytes", dflt.max_body_bytes), "serve.max_body_bytes", 1),
        read_token_env=v.opt_string(d.get("read_token_env"), "serve.read_token_env"),
        require_timestamp=v.boolean(d.get("require_timestamp", dflt.require_timestamp), "serve.require_timestamp"),
        replay_window=v.integer(d.get("replay_window", dflt.replay_window), "serve.replay_window", 1),
        dsn=_dsn_projects(v, d.get("dsn"), repos),
        max_events_per_minute=v.integer(d.get("max_events_per_minute", dflt.max_events_per_minute),
                                        "serve.max_events_per_minute", 1),
        url=None if d.get("url") is None else _api_url(v, d["url"], "serve.url"))


def _dsn_projects(v: Validator, raw: Any, repos: dict) -> tuple[DsnProject, ...]:
    """``serve.dsn: [{project: 42, key_env: NAME, service: S, repo: KEY}]``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        v.fail("serve.dsn", "a list of {project, key_env, service, repo}", raw)
    out: list[DsnProject] = []
    for i, item in enumerate(raw):
        p = f"serve.dsn[{i}]"
        d = v.mapping(item, p, tuple(DsnProject.__dataclass_fields__))
        project = d.get("project")
        if isinstance(project, int) and not isinstance(project, bool) and project > 0:
            project = str(project)
        if not isinstance(project, str) or not project.isdigit() or len(project) > 20:
            v.fail(f"{p}.project", "a positive integer (the number at the end of the DSN)", project)
        if any(x.project == project for x in out):
            raise ConfigError(f"{v.filename}: {p}.project: project {project} is listed twice; give each one entry")
        repo = v.opt_string(d.get("repo"), f"{p}.repo")
        if repo is not None and repo not in repos:
            v.fail(f"{p}.repo", f"one of the repos configured under repos: ({', '.join(repos) or 'none'})", repo)
        out.append(DsnProject(project=project, key_env=v.string(d.get("key_env"), f"{p}.key_env"),
                              service=v.string(d.get("service"), f"{p}.service"), repo=repo))
    return tuple(out)


def _lessons(v: Validator, raw: Any) -> LessonsConfig:
    d = v.mapping(raw, "lessons", tuple(LessonsConfig.__dataclass_fields__))
    dflt = LessonsConfig()
    return LessonsConfig(
        reviewers=v.boolean(d.get("reviewers", dflt.reviewers), "lessons.reviewers"),
        per_service=v.integer(d.get("per_service", dflt.per_service), "lessons.per_service", 0, 50),
        max_chars=v.integer(d.get("max_chars", dflt.max_chars), "lessons.max_chars", 20, 2000))


def _forges(v: Validator, raw: Any) -> ForgesConfig:
    """``forges.timeout``: ``{connect: S, read: S}``, ``[connect, read]`` or one number for both (seconds > 0)."""
    d = v.mapping(raw, "forges", ("timeout",))
    if d.get("timeout") is None:
        return ForgesConfig()
    value, path = d["timeout"], "forges.timeout"
    dflt = ForgesConfig.timeout
    if isinstance(value, dict):
        t = v.mapping(value, path, ("connect", "read"))
        pair = (t.get("connect", dflt[0]), t.get("read", dflt[1]))
    elif isinstance(value, list) and len(value) == 2:
        pair = (value[0], value[1])
    else:
        pair = (value, value)
    out = []
    for name, x in zip(("connect", "read"), pair):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x <= 3600:
            v.fail(f"{path}.{name}", "seconds, a number above 0 and at most 3600 ({connect: S, read: S})", x)
        out.append(float(x))
    return ForgesConfig(timeout=(out[0], out[1]))


def _api_url(v: Validator, value: Any, path: str) -> str:
    url = v.string(value, path).rstrip("/")
    if not url.startswith(("https://", "http://")):
        v.fail(path, "an http(s) URL of the API root (e.g. https://HOST/api/v4)", value)
    if "@" in url.split("//", 1)[1].split("/", 1)[0]:
        raise ConfigError(f"{v.filename}: {path}: secrets never go in config; put the token in the variable "
                          "named by token_env")
    return url


def parse_repo_settings(data: Any, filename: str = ".agent/config.yaml") -> RepoSettings:
    v = Validator(filename)
    top = v.mapping(data, "", ("check", "blocked_paths", "lanes", "proof"))
    return RepoSettings(
        check=v.opt_string(top.get("check"), "check"),
        blocked_paths=v.strings(top.get("blocked_paths"), "blocked_paths"),
        lanes=_lanes(v, top.get("lanes"), "lanes"),
        proof=_proof(v, top.get("proof")),
    )


def _proof(v: Validator, value: Any) -> ProofSettings:
    """``proof: optional`` (a mode alone) or ``proof: {mode: required|optional|off, tests: [globs]}``."""
    if value is None:
        return ProofSettings()
    if value is False or isinstance(value, str):   # YAML reads a bare `off` as false
        return ProofSettings(mode=v.string("off" if value is False else value, "proof", PROOF_MODES))
    top = v.mapping(value, "proof", ("mode", "tests"))
    mode = top.get("mode", "required")
    mode = v.string("off" if mode is False else mode, "proof.mode", PROOF_MODES)
    return ProofSettings(mode=mode, tests=v.strings(top.get("tests"), "proof.tests"))


CONFIG_CACHE = "config.yaml.json"      # in the home: the config file's YAML document, by its text's hash


def _read_yaml(path: Path, cache: Path | None = None) -> Any:
    from agent.infra.textio import load_yaml_cached, read_text

    return load_yaml_cached(read_text(path, error=ConfigError).text, str(path), cache, error=ConfigError)


def load_config(path: Path, required: bool = False, cache: Path | None = None) -> Config:
    """Load the home config; a missing file is an empty config unless ``required``.  ``cache``: where the parsed
    YAML is kept for the next process (``agent.infra.textio.load_yaml_cached``; the home's ``CONFIG_CACHE``)."""
    if not path.exists():
        if required:
            raise ConfigError(f"{path}: no such config file; run `agent init` or pass an existing --config")
        return Config(path=None)
    return parse_config(_read_yaml(path, cache), filename=str(path), path=path)


DEFAULT_CONFIG = """\
# agent configuration. Every key is optional; see `agent --help` and DESIGN.md.
# Secrets never live here: name environment variables instead.

# repos:
#   acme/widgets:
#     url: https://github.com/acme/widgets.git   # any git URL or local path
#     base: main
#     forge: local                               # github | gitlab | gitea | local
#     services: [widgets-api]
#     check: "python -m pytest -q"
#     branch_prefix: "agent/fix-"

# lanes:
#   implementer: {vendor: codex, timeout: 1800, repair: 2}
#   reviewer:    {vendor: claude}
#   pr-quality:  {vendor: claude}
#   pr-logic:    {vendor: codex}
#   decider:     {vendor: claude}

# limits:
#   round_cap: 5
#   repair: 1
#   lane_timeout: 1800
#   check_timeout: 900
#   task_budget_usd: 3.0
#   daily_budget_usd: 50.0
#   open_drafts_per_repo: 3
#   prs_per_hour: 2
#   workspace_failures: 3          # failed clones/fetches in a row before the task is gate-blocked
#   feedback_rounds: 3        # rounds started by PR review comments or PR CI (they count to round_cap too)
#   worktree_grace: 86400            # seconds a finished task's worktree stays (PR merged/closed, task failed)
#   worktree_max_mb: 2048            # a worktree grown past this after a lane or check fails the round
#   lane_tmp_mb: 1024                # a lane's private /tmp and home: tmpfs (RAM) capped at this size each
#   shutdown_grace: 10               # seconds the first Ctrl-C/SIGTERM lets running lanes finish (then stopped)

# review:
#   allowed_users: [your-login]   # may steer PRs by comments, besides people with write access
# feedback:
#   ci_wait: 3600                 # seconds a pushed PR head may have no CI result before that is reported
#   ci_apps: [github-actions]     # GitHub Apps whose check runs count as the PR's CI (others are ignored)

# prices:                             # USD per million tokens, for vendors that report tokens only
#   codex: {input: 1.25, output: 10.0}  # (codex, gemini); key: a model or vendor name; defaults built in

# sandbox: bwrap                               # every lane runs in bubblewrap; `none` only if you must (doctor warns)
# sandbox: {mode: bwrap, network: proxy, allow_hosts: [pypi.org, "llm.corp.example:8443"]}
#                    # network: proxy (default: own network namespace, only the vendor's model hosts and these through
#                    # the agent's egress proxy) | none (no network) | host (the host's network; doctor warns)
#                    # unix_sockets: deny (default: socket(AF_UNIX) fails in a lane, so it reaches no host socket;
#                    # socketpair works) | allow

# lessons:                     # a lane's LESSON steers later lanes only once a human merged its PR
#   reviewers: false           # reviewer specs carry lessons too
#   per_service: 5             # accepted lessons per spec (same service or error), newest first
#   max_chars: 300             # a longer LESSON is refused, like one holding a URL or a command

# decide: {auto: false, min_count: 3, max_age_days: 14, max_per_scan: 10}
# git: {author_name: agent, author_email: agent@localhost}
# github: {api_url: https://api.github.com, token_env: GITHUB_TOKEN}
# github: {app_id: 123456, private_key_file: ~/.config/agent/app.pem}   # or as a GitHub App (README)
# gitlab: {api_url: https://gitlab.example.com/api/v4, token_env: GITLAB_TOKEN}   # PRIVATE-TOKEN; self-managed too
# gitea:  {api_url: https://git.example.com/api/v1, token_env: GITEA_TOKEN}       # also Forgejo
# forges: {timeout: {connect: 10, read: 30}}      # seconds, every forge HTTP call
# sources:
#   - {kind: file, path: /var/log/widgets/*.log, service: widgets-api}

# notify:                                     # events: gate-blocked failed pr-opened pr-merged pr-closed budget
#   - {kind: slack, url_env: SLACK_WEBHOOK_URL, on: [gate-blocked, failed, pr-opened]}
#   - {kind: webhook, url: "https://ops.example/hooks/agent", secret_env: AGENT_NOTIFY_SECRET, on: [gate-blocked]}
#   - {kind: email, smtp: "smtp.example:587", user_env: SMTP_USER, password_env: SMTP_PASSWORD,
#      to: [oncall@example.com], on: [failed, budget]}

# ledger:                                     # default: SQLite in the home (ledger.db)
#   url: postgresql://agent@db.example:5432/agent   # one PostgreSQL ledger for several runners; the password
#                                                   # goes in PGPASSWORD or ~/.pgpass. AGENT_LEDGER_URL wins.

# serve:                                      # `agent serve` / `agent daemon --serve`
#   events_secret_env: AGENT_HOOK_SECRET      # /hooks/events: X-Agent-Signature: sha256=<HMAC-SHA256 of the body>
#   sentry_secret_env: SENTRY_CLIENT_SECRET   # /hooks/sentry: Sentry-Hook-Signature
#   alertmanager_token_env: ALERTMANAGER_TOKEN  # /hooks/alertmanager: Authorization: Bearer <token>
#   max_body_bytes: 1048576
#   read_token_env: AGENT_READ_TOKEN          # Authorization: Bearer <token> for /, /tasks/N, /metrics (unset:
#                                             # loopback only, unless `--public`)
#   require_timestamp: false                  # /hooks/events must send a signed X-Agent-Timestamp
#   replay_window: 300                        # seconds a hook's timestamp may differ from now (Sentry, events)
#   url: http://agent.internal:8080          # where SDKs reach it; `agent doctor` prints each project's DSN
#   dsn:                                      # a Sentry DSN for unmodified SDKs: /api/<project>/envelope/ and /store/
#     - {project: 1, key_env: AGENT_DSN_KEY, service: widgets-api}   # DSN http://<key>@host:port/1
#   max_events_per_minute: 600                # over it: 429 with Retry-After, SDKs back off
"""
