"""`agent doctor`: is this machine and home ready to run? One check per concern, each with a one-line fix.

Checks: git (>= 2.25), the ledger (opens read-only, is an agent ledger, schema, ``PRAGMA integrity_check``, WAL;
on PostgreSQL: connects, schema, migrations known; agent/ledger/health.py holds the SQL), its trust (schema and
append-only triggers as the migrations made them, no event gaps), stale runners (a warning: who, since when, what
each still holds),
the config (parses and validates), every vendor a configured lane role uses (binary on the lane's PATH, its version,
an auth probe), every configured repository's forge (local: ``git ls-remote`` of the URL; github, gitlab, gitea: a
token resolves, and with ``online`` GET /user, the token user's access to the project on GitLab/Gitea, and
``git ls-remote``), and free disk in the home.

Doctor only looks: it never creates the home, never migrates the ledger and never runs a lane. The auth probe can
only see whether a key variable or the vendor's own credential file is *present*; whether the key is valid is known
at the first lane run (a refused key makes the lane "unavailable" and the task gate-blocked with the reason).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.config import FIXER_ROLES

MIN_GIT = (2, 25)
MIN_FREE_BYTES = 1 << 30          # warn under 1 GiB: mirrors and worktrees live in the home
PROBE_TIMEOUT = 10.0
LS_REMOTE_TIMEOUT = 20.0

# Built-in vendors: the variables their CLIs read a key from, and the credential files their own login writes
# (relative to HOME; the lane gets our HOME).  Presence only: doctor never sends a key anywhere but GitHub.
VENDOR_KEYS: dict[str, tuple[str, ...]] = {
    "claude": ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"),
    "codex": ("OPENAI_API_KEY", "CODEX_API_KEY"),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "grok": ("GROK_API_KEY", "XAI_API_KEY"),
    "aider": ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "OPENROUTER_API_KEY", "DEEPSEEK_API_KEY"),
    "opencode": ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY", "GEMINI_API_KEY"),
}
VENDOR_CRED_FILES: dict[str, tuple[str, ...]] = {
    "claude": (".claude/.credentials.json",),
    "codex": (".codex/auth.json",),
    "gemini": (".gemini/oauth_creds.json",),
    "grok": (".grok/user-settings.json",),
    "opencode": (".local/share/opencode/auth.json",),
    "aider": (),
}
VENDOR_LOGIN = {"claude": "claude (then /login)", "codex": "codex login", "gemini": "gemini (sign in once)",
                "grok": "grok (set the key once)", "opencode": "opencode auth login"}
_SECRET_RE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.I)
PRESENCE_NOTE = "presence only: validity shows at the first lane run"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    warn: bool = False            # ok, but said out loud (e.g. `sandbox: none`)

    def to_json(self) -> dict:
        return asdict(self)


def _run(argv: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None):
    """Run a probe through the one process runner; returns (ProcResult, stdout, stderr)."""
    from agent.infra import proc

    with tempfile.TemporaryDirectory(prefix="agent-doctor-") as tmp:
        res = proc.run(argv, cwd=cwd or tmp, env=env, timeout=timeout, stdout_path=Path(tmp) / "out",
                       stderr_path=Path(tmp) / "err", max_bytes=65536, tail_bytes=4096, grace=1.0)
        return res, res.stdout_text(), res.stderr_text()


def _last_line(text: str, limit: int = 200) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


# ---------------------------------------------------------------------------------------------- git


def parse_git_version(text: str) -> tuple[int, ...] | None:
    m = re.search(r"git version (\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(x) for x in m.groups() if x is not None) if m else None


def check_git() -> Check:
    fix = f"install git >= {MIN_GIT[0]}.{MIN_GIT[1]} (worktree move needs it), e.g. `apt-get install git`"
    res, out, err = _run(["git", "--version"], PROBE_TIMEOUT)
    if res.status != "ok":
        return Check("git", False, f"git --version: {res.status} ({_last_line(err) or res.error or 'no output'})",
                     fix)
    version = parse_git_version(out)
    if version is None:
        return Check("git", False, f"cannot read a version from {out.strip()[:80]!r}", fix)
    shown = ".".join(map(str, version))
    if version[:2] < MIN_GIT:
        return Check("git", False, f"git {shown} is older than {MIN_GIT[0]}.{MIN_GIT[1]}", fix)
    return Check("git", True, f"git {shown}")


# ---------------------------------------------------------------------------------------------- ledger


def ledger_location(home: Path, config_path: Path | None = None):
    """(where the ledger is, None) or (None, a failing Check for a malformed ledger URL)."""
    from agent.ledger import backend

    try:
        return backend.resolve(home, config_path), None
    except backend.BackendError as exc:
        return None, Check("ledger", False, str(exc).split("; unset it")[0],
                           f"fix ledger.url in the config or {backend.ENV_URL} (or unset both for the SQLite ledger "
                           "in the home)")


def check_ledger(home: Path, where=None) -> Check:
    """Opens the ledger read-only (SQLite file or PostgreSQL database): never creates or migrates it."""
    from agent.ledger import health

    if where is None:
        where, bad = ledger_location(home)
        if bad is not None:
            return bad
    found = health.status(where)
    return Check("ledger", found.ok, found.detail, found.fix)


def check_ledger_tamper(home: Path, where=None) -> list[Check]:
    """Evidence that something other than agent wrote the ledger (a lane without the sandbox could): schema and
    append-only triggers against the migrations, deleted events, a round cap no event explains."""
    from agent.ledger import backend, health

    if where is None:
        where, bad = ledger_location(home)
        if bad is not None:
            return []
    found = health.tamper(where)
    if found is None:
        return []                         # check_ledger says what is wrong with it
    if not found:
        return [Check("ledger trust", True, "schema and append-only triggers as the migrations made them; event ids "
                      "contiguous; every round cap explained by its events")]
    kept = "a dump of the database (`pg_dump`)" if backend.is_url(where) else "the file"
    return [Check("ledger trust", False, f"{backend.display(where)}: tampered with: " + "; ".join(found)[:600],
                  f"stop the daemon/cron, keep {kept} for forensics, restore the ledger from a backup; run lanes in "
                  "the sandbox (`sandbox: bwrap`) so no lane can reach it")]


def check_runners(where, now: float | None = None) -> list[Check]:
    """Runners that are dead (this machine: their pid is gone without a clean stop) or silent (no heartbeat past
    the stale threshold), each a warning naming its host, why and what it still holds; a silent runner whose task
    claim is still within its lease is named as such (its tasks wait for that lease). A runner whose clock is more
    than 5 s off the ledger's is a warning too. One `ok` line otherwise (stopped runners are fine). Nothing when
    the ledger cannot be read (the ledger check says why)."""
    from agent.coord.runners import SKEW_WARN_S, runner_view, stale_after_s
    from agent.ledger import health
    from agent.app.status import held_text
    from agent.domain.wording import ago

    found = health.runners(where)
    if found is None:
        return []
    *rows, db_now = found
    now = db_now if now is None else now
    view = runner_view(*rows, now=now)
    limit = ago(stale_after_s())
    bad = [r for r in view if r["state"] in ("dead", "silent")]
    skewed = [r for r in view if r["clock_skewed"]]
    checks = []
    for r in skewed:
        checks.append(Check(f"runner {r['id']} clock", True,
                            f"host {r['host']}: its clock was {r['clock_offset_s']:+.1f}s off the ledger's at its last "
                            f"heartbeat (more than {SKEW_WARN_S:.0f}s); leases use the ledger's clock, but its logs and "
                            "timestamps are off", f"fix the time sync on {r['host']} (`timedatectl`, chrony or ntpd)",
                            warn=True))
    if not bad:
        stopped = sum(1 for r in view if r["state"] == "stopped")
        what = (f"{len(view)} runner(s), each with a heartbeat within {limit}" if view and not stopped else
                f"{len(view)} runner(s): {len(view) - stopped} with a heartbeat within {limit}, {stopped} stopped "
                "cleanly" if view else
                "no runner has registered yet (every `agent watch` and `agent daemon` pass registers one)")
        return [Check("runners", True, what), *checks]
    for r in bad:
        who = f"host {r['host']}, home {r['home']}, pid {r['pid']}" if r["host"] else "not in the runners table"
        live = [t for t in r["tasks"] if not t["lease_expired"]]
        detail = f"{who}: {r['why']}; holds {held_text(r, now)}"
        if r["state"] == "dead":
            fix = ("nothing to do: its claims are free now (its pid is gone), so any running runner takes its "
                   "task(s) over at its next pass; `agent runners --prune` removes it once it holds nothing")
        elif live:
            tasks = ", ".join(f"task {t['task_id']}" for t in live)
            detail += (f"; its claim on {tasks} is still within its lease, so no other runner may take "
                       f"{'it' if len(live) == 1 else 'them'} over until that lease ends")
            proc = f"pid {r['pid']} on {r['host']}" if r["host"] else "its process"
            fix = (f"a runner that stopped beating should not be renewing leases: check whether {proc} is stuck "
                   f"and that host's network to the ledger; the task(s) are taken over once the lease ends")
        elif r["tasks"] or r["leases"]:
            fix = ("nothing to do if the runner is gone: its leases have expired, so any running runner takes its "
                   "task(s) over at its next pass; once they are released, `agent runners --prune` removes it")
        else:
            fix = f"if it is gone for good: `agent runners --prune` removes runners that hold nothing (stale after {limit})"
        checks.append(Check(f"runner {r['id']}", True, detail, fix, warn=True))
    return checks


# ---------------------------------------------------------------------------------------------- config


def check_config(config_path: Path, required: bool):
    """Returns (Check, Config or None)."""
    from agent import AgentError
    from agent.config import load_config

    try:
        config = load_config(config_path, required=required)
    except AgentError as exc:
        return Check("config", False, str(exc)[:400], f"fix {config_path} at the key named above, then rerun "
                     "`agent doctor`"), None
    if config.path is None:
        detail = f"{config_path}: not there; built-in defaults (no repos, no lanes)"
    else:
        detail = (f"{config_path}: valid; {len(config.repos)} repo(s), {len(config.lanes)} lane role(s), "
                  f"{len(config.sources)} source(s)")
    missing = [what for what, have in (("no repo", config.repos), ("no lane role", config.lanes)) if not have]
    if missing:  # valid, but nothing would ever be fixed: not "healthy"
        return Check("config", True, f"{detail}; {' and '.join(missing)}, so nothing will be fixed",
                     f"add `repos:` and `lanes:` to {config_path} (`agent init` wrote commented examples), then "
                     "rerun `agent doctor`", warn=True), config
    return Check("config", True, detail), config


def check_network(config, environ=None) -> Check:
    """`sandbox.network: proxy` (default): a base URL a vendor is given must be on its allowlist; `host` is allowed
    but warned; `none` says what it means."""
    from agent.lanes.egress import mode, unlisted_base_urls
    from agent.lanes.sandbox import mode as sandbox_mode

    net = mode(config)
    if sandbox_mode(config) == "none":
        return Check("network", True, "sandbox: none: lanes share the host's network, its loopback services and "
                     "unix sockets", "install bubblewrap and remove `sandbox: none`", warn=True)
    if net == "host":
        return Check("network", True, "sandbox.network: host: lanes reach the host's loopback services (agent "
                     "serve, databases), the LAN and any host on the internet",
                     "remove `network: host` (default proxy: only the vendors' model hosts)", warn=True)
    if net == "none":
        return Check("network", True, "sandbox.network: none: lanes have no network (a vendor CLI cannot reach its "
                     "model)")
    unlisted = unlisted_base_urls(config, lane_vendors(config), os.environ if environ is None else environ)
    if unlisted:
        vendor, var, hostport = unlisted[0]
        return Check("network", False, f"vendors.{vendor}: {var} points at {hostport}, which is not on its "
                     "allowlist: the egress proxy refuses it and its lanes cannot reach their model",
                     f'add "{hostport}" to vendors.{vendor}.hosts in config.yaml')
    return Check("network", True, "sandbox.network: proxy: lanes reach only their vendor's model hosts, "
                 "vendors.X.hosts and sandbox.allow_hosts, through the agent's egress proxy")


def check_sandbox(config) -> Check:
    """`sandbox: bwrap` needs bwrap (lanes refuse to start without it); `sandbox: none` is allowed but warned."""
    from agent.lanes.sandbox import INSTALL_FIX, bwrap_path, mode

    if mode(config) == "none":
        return Check("sandbox", True, "sandbox: none: lanes run unconfined; a lane can read the ledger and other "
                     "tasks, and write anything this user can", "install bubblewrap and remove `sandbox: none`",
                     warn=True)
    found = bwrap_path()
    if found is None:
        return Check("sandbox", False, "sandbox: bwrap, but bwrap is not installed: every lane refuses to start",
                     INSTALL_FIX)
    return Check("sandbox", True, f"bwrap at {found}: every lane and check runs sandboxed")


def check_lane_secrets(config) -> list[Check]:
    """A credential variable under vendors.X.env never reaches the lane: the config promises something that does
    not happen, or someone tried to give a lane a forge token."""
    from agent.infra.env import denied_in_config

    found = denied_in_config(config)
    if not found:
        return []
    shown = ", ".join(f"vendors.{v}.env: {var}" for v, var in found)
    return [Check("lane secrets", False, f"{shown}: forge and source credentials never reach a lane (they are "
                  "dropped)", "remove " + ", ".join(sorted({var for _, var in found})) + " from vendors.*.env; lanes "
                  "need only their model API key")]


def check_roles(config) -> list[Check]:
    """Roles the fixer needs once a repository is configured (and the decider when decide.auto is on)."""
    needed = list(FIXER_ROLES) if config.repos else []
    if config.decide.auto:
        needed.append("decider")
    missing = [r for r in needed if r not in config.lanes]
    if not missing:
        return []
    return [Check("lanes", False, f"no lane configured for role(s) {', '.join(missing)}",
                  "add " + ", ".join(f"lanes.{r}: {{vendor: NAME}}" for r in missing) + " to config.yaml")]


# ---------------------------------------------------------------------------------------------- lanes


def _which(bin_name: str, path_var: str | None) -> str | None:
    found = shutil.which(bin_name, path=path_var)
    if found is None and os.path.sep in bin_name and os.access(bin_name, os.X_OK) and os.path.isfile(bin_name):
        found = os.path.abspath(bin_name)
    return found


def check_vendor(config, name: str, roles: list[str], home: Path | None = None) -> Check:
    """Binary on the lane's PATH and its version, for one vendor serving ``roles``; with ``home``, the version is
    probed in the sandbox the lane gets, so "ok" means the lane can start there."""
    from agent import AgentError
    from agent.infra.env import lane_env, secret_env_names
    from agent.lanes.vendors import get_vendor

    label = f"lane {name} ({', '.join(roles)})"
    vc = config.vendor(name)
    try:
        adapter = get_vendor(name, config)
    except AgentError as exc:
        return Check(label, False, str(exc)[:300], f"define vendors.{name}.command in config.yaml or use a vendor "
                     "this build has an adapter for (`agent lane list`)")
    env = lane_env(vc.env, deny=secret_env_names(config))
    bin_name = vc.bin or adapter.default_bin
    bin_path = _which(bin_name, env.get("PATH"))
    if bin_path is None:
        return Check(label, False, f"{bin_name}: not found on the lane's PATH ({env.get('PATH')})",
                     f"install {bin_name} on that PATH, or set vendors.{name}.bin to its full path")
    argv = adapter.version_argv(bin_path)
    if not argv:
        from agent.lanes.lane import sha256_file

        return Check(label, True, f"{bin_path}; no version flag for a command vendor, binary "
                     f"sha256:{sha256_file(Path(bin_path))[:16]}")
    shown = " ".join(argv)
    if home is not None:
        from agent.lanes.sandbox import SandboxUnavailable, probe_argv

        try:
            with tempfile.TemporaryDirectory(prefix="agent-probe-") as scratch:
                argv, env = probe_argv(config, Path(home), argv, env, Path(scratch) / "sandbox")
                res, out, err = _run(argv, PROBE_TIMEOUT, env=env)
        except SandboxUnavailable as exc:
            return Check(label, False, str(exc)[:300], "see the sandbox check above")
    else:
        res, out, err = _run(argv, PROBE_TIMEOUT, env=env)
    text = (out or err).strip()
    if res.status != "ok" or not text:
        why = "timed out" if res.timed_out else f"exit {res.exit_code}"
        from agent.lanes.sandbox import sandbox_exec_failure

        cause = sandbox_exec_failure(err)
        if cause:
            return Check(label, False, f"{shown}: the lane's sandbox cannot start it ({cause})",
                         f"install {bin_name} where its files are readable, or set vendors.{name}.bin to an "
                         "executable whose interpreter exists")
        return Check(label, False, f"{shown}: {why} ({_last_line(err or out) or 'no output'})",
                     f"run `{shown}` by hand; reinstall {bin_name} if it does not print a version")
    return Check(label, True, f"{bin_path}; {text.splitlines()[0][:120]}")


def check_vendor_auth(config, name: str, environ: dict | None = None, user_home: Path | None = None) -> Check:
    """Auth probe by presence: a key variable the lane will see, or the vendor's own credential file."""
    env = os.environ if environ is None else environ
    user_home = Path(user_home or env.get("HOME") or Path.home())
    vc = config.vendor(name)
    label = f"auth {name}"
    named = list(vc.env)
    named_keys = [n for n in named if _SECRET_RE.search(n) and not n.upper().endswith("_URL")]
    known = VENDOR_KEYS.get(name, ()) if not vc.command else ()
    set_named = [n for n in named_keys if env.get(n)]
    unset_named = [n for n in named_keys if not env.get(n)]
    creds = [str(user_home / rel) for rel in VENDOR_CRED_FILES.get(name, ()) if (user_home / rel).is_file()]
    if name == "codex" and "CODEX_HOME" in named and env.get("CODEX_HOME"):
        if (Path(env["CODEX_HOME"]) / "auth.json").is_file():
            creds.append(str(Path(env["CODEX_HOME"]) / "auth.json"))
    seen = ", ".join([f"{n} set" for n in set_named] + [f"credential file {c}" for c in creds])

    if unset_named and not creds:
        return Check(label, False, f"{', '.join(unset_named)} named under vendors.{name}.env but not set in this "
                     f"environment ({PRESENCE_NOTE})",
                     f"export {unset_named[0]}=... where agent runs (cron/daemon env), or remove it from "
                     f"vendors.{name}.env")
    if set_named or creds:
        extra = f"; {', '.join(unset_named)} not set" if unset_named else ""
        return Check(label, True, f"{seen}{extra} ({PRESENCE_NOTE})")
    if vc.command or name not in VENDOR_KEYS:
        return Check(label, True, f"command vendor names no key variable under vendors.{name}.env; "
                     "nothing to probe (it authenticates itself, or needs no key)")
    # a built-in CLI with neither a key the lane can see nor a login
    hidden = [n for n in known if env.get(n) and n not in named]
    if hidden:
        return Check(label, False, f"{hidden[0]} is set but not named under vendors.{name}.env, so the lane never "
                     "sees it (lanes get an allowlisted environment)",
                     f"add {hidden[0]} to vendors.{name}.env in config.yaml")
    files = ", ".join("~/" + rel for rel in VENDOR_CRED_FILES.get(name, ())) or "none known"
    return Check(label, False, f"no key variable named under vendors.{name}.env and no credential file "
                 f"({files}); the lane would fail to authenticate",
                 f"set {known[0]} and list it under vendors.{name}.env"
                 + (f", or log in once with `{VENDOR_LOGIN[name]}`" if name in VENDOR_LOGIN else ""))


def lane_vendors(config) -> dict[str, list[str]]:
    """vendor -> the configured roles it serves."""
    out: dict[str, list[str]] = {}
    for role, lc in sorted(config.lanes.items()):
        out.setdefault(lc.vendor, []).append(role)
    return out


# ---------------------------------------------------------------------------------------------- forges


def check_remote(repo) -> Check:
    label = f"remote {repo.name}"
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "SSH_ASKPASS": "true"}
    env["GIT_SSH_COMMAND"] = env.get("GIT_SSH_COMMAND") or "ssh -o BatchMode=yes -o ConnectTimeout=10"
    res, out, err = _run(["git", "ls-remote", "--heads", repo.url, repo.base], LS_REMOTE_TIMEOUT, env=env)
    fix = f"check repos.{repo.name}.url in config.yaml and access to it: `git ls-remote {repo.url}`"
    if res.status != "ok":
        from agent.git.workspace import git_error_line

        why = "timed out" if res.timed_out else git_error_line(err) or res.error or f"exit {res.exit_code}"
        return Check(label, False, f"git ls-remote {repo.url}: {why}", fix)
    if not out.strip():
        return Check(label, False, f"{repo.url}: reachable, but has no branch {repo.base!r}",
                     f"set repos.{repo.name}.base to the default branch, or push {repo.base} to the remote")
    return Check(label, True, f"{repo.url}: reachable, {repo.base} at {out.split()[0][:12]}")


def check_github(config, repo, online: bool = False, environ: dict | None = None) -> Check:
    from agent.forge import ForgeError
    from agent.forge.github import GithubForge, resolve_token

    gh = config.github
    label = f"forge {repo.name} (github)"
    if gh.app:
        return check_github_app(config, repo, online, environ)
    try:
        token = resolve_token(gh.token_env, gh.token_command, environ=environ)
    except ForgeError as exc:
        return Check(label, False, str(exc), f"export {gh.token_env}=<token with pull-requests: write> or set "
                     "github.token_command (e.g. [gh, auth, token])")
    if not online:
        return Check(label, True, f"a token resolves ({gh.token_env}/GH_TOKEN/token_command); not sent "
                     "anywhere: `agent doctor --online` asks GitHub who it belongs to")
    forge = GithubForge(repo.name, api_url=gh.api_url, token=token, retries=0, timeout=(5.0, 10.0))
    try:
        user = forge.user()
    except ForgeError as exc:
        return Check(label, False, str(exc).replace(", then `agent task reset`", ""),
                     f"set a valid token in {gh.token_env} (or fix github.token_command); check github.api_url "
                     f"({gh.api_url})")
    return Check(label, True, f"{gh.api_url}: token belongs to {user.get('login') or '?'} (repository access "
                 "is checked when the first PR opens)")


def check_github_app(config, repo, online: bool = False, environ: dict | None = None) -> Check:
    """A GitHub App: the private key signs a JWT; with ``online``, the installation, its permissions and what is
    missing of pull requests: write, contents: write, checks: read."""
    from agent.forge import ForgeError
    from agent.forge.github_app import REQUIRED, app_for

    gh = config.github
    label = f"forge {repo.name} (github app {gh.app_id})"
    app = app_for(config, repo.name, environ=environ)
    key_fix = ("point github.private_key_file at the app's private key (.pem)" if gh.private_key_file
               else f"export the app's private key (PEM) in {gh.private_key_env}")
    try:
        app.jwt()
    except ForgeError as exc:
        return Check(label, False, str(exc), key_fix)
    if not online:
        return Check(label, True, "the private key signs a JWT; not sent anywhere: `agent doctor --online` asks "
                     "GitHub for the app's installation and permissions")
    try:
        bot = app.bot_login()
        inst = app.describe()
    except ForgeError as exc:
        return Check(label, False, str(exc), f"install the app on {repo.name} (or fix github.installation_id); "
                     f"check github.app_id and github.api_url ({gh.api_url})")
    perms = ", ".join(f"{k}: {v}" for k, v in sorted(inst["permissions"].items())) or "none"
    where = f"{gh.api_url}: {bot}, installation {inst['id']} on {inst['account']} ({perms})"
    if inst["missing"]:
        need = ", ".join(f"{k}: {v}" for k, v in inst["missing"].items())
        return Check(label, False, f"{where}; missing {need}",
                     f"give the app {need} in its settings, then accept the new permissions on the installation")
    return Check(label, True, f"{where}; has {', '.join(f'{k}: {v}' for k, v in REQUIRED.items())}")


def check_hosted(config, repo, online: bool = False, environ: dict | None = None) -> Check:
    """GitLab or Gitea/Forgejo: the token variable is set; with ``online``, GET /user through the forge and the
    token user's own access to the project (GitLab: effective access level >= 30; Gitea: write or more)."""
    from agent.forge import ForgeError, forge_class

    fc = getattr(config, repo.forge)                      # config.gitlab / config.gitea
    label = f"forge {repo.name} ({repo.forge})"
    env = os.environ if environ is None else environ
    token = (env.get(fc.token_env) or "").strip()
    display = {"gitlab": "GitLab", "gitea": "Gitea"}[repo.forge]
    scopes = {"gitlab": "an access token with the api scope, user at least Developer on the project",
              "gitea": "an access token with write:repository and write:issue"}[repo.forge]
    if not token:
        return Check(label, False, f"{fc.token_env} is not set (the {display} token)",
                     f"export {fc.token_env}=<{scopes}> where agent runs, or change {repo.forge}.token_env")
    if not online:
        return Check(label, True, f"{fc.token_env} is set; not sent anywhere: `agent doctor --online` asks "
                     f"{fc.api_url} who it belongs to")
    kwargs = {"wip_prefix": config.gitea.wip_prefix} if repo.forge == "gitea" else {}
    forge = forge_class(repo.forge)(repo.name, api_url=fc.api_url, token=token, base=repo.base, retries=0,
                                    timeout=(5.0, 10.0), token_env=fc.token_env, **kwargs)
    try:
        me = forge.user()
        login = me.get("username") or me.get("login") or "?"
        if repo.forge == "gitlab":
            level = forge.access_level(int(me["id"]))
            ok, what = level >= 30, f"access level {level} on {repo.name}"
        else:
            perm = forge.permission(login)
            ok, what = perm in ("write", "admin", "owner"), f"permission {perm} on {repo.name}"
    except ForgeError as exc:
        return Check(label, False, str(exc).replace(", then `agent task reset`", ""),
                     f"set a valid token in {fc.token_env}; check {repo.forge}.api_url ({fc.api_url}) and "
                     f"repos.{repo.name}")
    if not ok:
        need = "the Developer role (30)" if repo.forge == "gitlab" else "write access"
        return Check(label, False, f"{fc.api_url}: token belongs to {login}, {what}: too little to open a draft",
                     f"give {login} at least {need} on {repo.name}")
    return Check(label, True, f"{fc.api_url}: token belongs to {login}, {what}")


def check_forges(config, online: bool = False, environ: dict | None = None) -> list[Check]:
    checks = []
    for repo in config.repos.values():
        if repo.forge == "github":
            checks.append(check_github(config, repo, online, environ))
            if online:
                checks.append(check_remote(repo))
        elif repo.forge in ("gitlab", "gitea"):
            checks.append(check_hosted(config, repo, online, environ))
            if online:
                checks.append(check_remote(repo))
        else:
            checks.append(check_remote(repo))
    return checks


def check_sentry_dsn(config, environ: dict | None = None) -> list[Check]:
    """Each ``serve.dsn`` project: the DSN to paste into the SDK, and a warning when SDKs would reach `agent serve`
    beyond loopback over plain HTTP (the key and the error text would travel in clear)."""
    from urllib.parse import urlsplit

    from agent.intake.dsn import dsn_url

    env = os.environ if environ is None else environ
    base = config.serve.url or "http://127.0.0.1:8080"
    host = urlsplit(base).hostname or ""
    clear = base.startswith("http://") and host not in ("127.0.0.1", "localhost", "::1")
    checks = []
    for p in config.serve.dsn:
        label = f"sentry dsn {p.project}"
        key = env.get(p.key_env)
        if not key:
            checks.append(Check(label, False, f"{p.key_env} (serve.dsn key_env) is not set: SDKs sending to project "
                                              f"{p.project} get 503",
                                f"export {p.key_env}=$(python3 -c 'import secrets; print(secrets.token_hex(16))') "
                                "where agent serve runs, then paste the DSN doctor prints into the SDK"))
            continue
        where = f"DSN for {p.service}: {dsn_url(base, p.project, key)}"
        if clear:
            checks.append(Check(label, True, f"{where}; SDKs reach agent serve at {host} over plain HTTP", "put a TLS "
                                "proxy in front of agent serve and set serve.url to its https:// address", warn=True))
        else:
            checks.append(Check(label, True, where + ("" if config.serve.url else
                                                      " (set serve.url to the address SDKs reach)")))
    return checks


# ---------------------------------------------------------------------------------------------- disk


def check_disk(home: Path, min_free: int = MIN_FREE_BYTES) -> Check:
    probe = Path(home)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    gib = free / (1 << 30)
    if free < min_free:
        return Check("disk", False, f"{gib:.2f} GiB free at {probe} (under {min_free / (1 << 30):.1f} GiB); "
                     "mirrors and worktrees live in the home",
                     "free space on that filesystem or move the home (AGENT_HOME) to a larger one")
    from agent.git.workspace import disk_use, human_bytes

    use = disk_use(home)
    return Check("disk", True, f"{gib:.1f} GiB free at {probe}; task worktrees {use['worktrees']['count']} "
                               f"({human_bytes(use['worktrees']['bytes'])}), mirrors {use['mirrors']['count']} "
                               f"({human_bytes(use['mirrors']['bytes'])})")


# ---------------------------------------------------------------------------------------------- all


def run_doctor(home: Path, config_path: Path, config_required: bool = False, online: bool = False,
               environ: dict | None = None, min_free: int = MIN_FREE_BYTES) -> dict:
    """Every check; ``{"ok": bool, "checks": [{name, ok, detail, fix}]}``. Never raises for a finding."""
    where, bad = ledger_location(home, config_path)
    checks = [check_git(), bad or check_ledger(home, where)]
    checks += check_ledger_tamper(home, where) if bad is None else []
    checks += check_runners(where) if bad is None else []
    cfg_check, config = check_config(config_path, config_required)
    checks.append(cfg_check)
    if config is not None:
        checks.append(check_sandbox(config))
        checks.append(check_network(config, environ))
        checks += check_lane_secrets(config)
        checks += check_roles(config)
        for vendor, roles in lane_vendors(config).items():
            checks.append(check_vendor(config, vendor, roles, home))
            checks.append(check_vendor_auth(config, vendor, environ))
        checks += check_forges(config, online, environ)
        checks += check_sentry_dsn(config, environ)
    checks.append(check_disk(home, min_free))
    unset = config is not None and not (config.repos and config.lanes)
    return {"ok": all(c.ok for c in checks), "checks": [c.to_json() for c in checks],
            **({"not_set_up": cfg_check.detail.rsplit("; ", 1)[-1]} if unset else {})}


def render_text(result: dict) -> str:
    lines = []
    for c in result["checks"]:
        tag = "FAIL" if not c["ok"] else ("WARN" if c.get("warn") else "ok  ")
        lines.append(f"{tag}  {c['name']}: {c['detail']}")
        if (not c["ok"] or c.get("warn")) and c["fix"]:
            lines.append(f"      fix: {c['fix']}")
    bad = [c for c in result["checks"] if not c["ok"]]
    warned = [c for c in result["checks"] if c["ok"] and c.get("warn")]
    lines.append("")
    note = f" ({len(warned)} warning(s): {', '.join(c['name'] for c in warned)})" if warned else ""
    # valid but with no repo or no lane nothing would ever be fixed: never "healthy"
    verdict = f"not set up yet: {result['not_set_up']}" if result.get("not_set_up") else "healthy"
    lines.append((verdict if not bad else f"{len(bad)} problem(s): " + ", ".join(c["name"] for c in bad)) + note)
    return "\n".join(lines)
