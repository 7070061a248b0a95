"""Built-in vendor adapters: codex, claude, opencode, aider, grok, gemini.

Each adapter turns a LaneContext into argv (+ stdin + extra env) for one headless turn, a resume
turn for repair, and reads a finished turn's output: the agent's last message, session id,
usage/cost, and whether the vendor refused authentication.  Facts per CLI (flags, JSON shapes) are
in shared/lane-clis.md and were re-checked against the pinned versions in scripts/ci-vendors by
tests/test_vendor_clis.py, which drives the real CLIs against a scripted local model.

Rules every adapter follows:
- implementer (ctx.writable) gets the vendor's own write mode; every other role gets the
  vendor's own read-only mode (the runner still verifies the worktree afterwards);
- the spec goes in by stdin or a file, never on argv when avoidable (argv is visible in ps and
  capped at 128 KiB per argument);
- no secret ever goes on argv (keys come from the lane environment, see agent/infra/env.py);
- read_turn never trusts the exit code alone and never raises.
- build_resume with no session id raises AgentError; the runner then gives one fresh retry.

``worktree_litter``: paths the CLI itself writes into the worktree whatever the agent does (grok: ``.grok/``,
aider: its repo-map cache), kept in ``agent.domain.names.WORKTREE_LITTER`` so git excludes them without
importing the adapters.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from agent import AgentError
from agent.lanes.files import read_lane_file, write_private
from agent.domain.names import WORKTREE_LITTER
from agent.lanes.protocol import Invocation, LaneContext, TurnOutput

# Read-only lanes may inspect history but not change anything.
GIT_READ_COMMANDS = ("git diff", "git log", "git show", "git status")

# a line that names an error: "Error: ...", "TypeError: ...", "error: ...", "fatal: ...", "panic: ...", not a stack
# frame ("    at main (...)"), not node's echo of the throwing source line ("    throw new Error(...)")
_ERROR_LINE = re.compile(r"^\s*(?:uncaught\s+|unhandled\s+)?(?:[\w.$]*(?:Error|Exception)\b|error\b|fatal\b|panic\b)",
                         re.IGNORECASE)
_NOISE_LINE = re.compile(r"^\s*(?:at\s|\^+\s*$|Node\.js v\d|Traceback \(most recent|File \")")


def crash_reason(stderr: str, exit_code: int | None, fallback: str = "") -> str:
    """Why a CLI crashed, in one line: the first stderr line that names an error (else the first line that is not a
    stack frame or a runtime banner), with the exit code.  The caller redacts it (agent.lanes.files.lane_text)."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    named = [ln for ln in lines if _ERROR_LINE.match(ln) and not _NOISE_LINE.match(ln)]
    plain = [ln for ln in lines if not _NOISE_LINE.match(ln)]
    line = (named or plain or [fallback])[0][:300]
    code = f"exit {exit_code}" if exit_code is not None else "no exit code"
    return f"{line} ({code})" if line else code


_AUTH_PATTERNS = re.compile(
    r"\b401\b|\b403\b|unauthori[sz]ed|invalid[ _-]?(x-)?api[ _-]?key|authentication[ _]?(error|failed)|"
    r"incorrect api key|please run /login|not logged in|api key required|permission_denied.*key",
    re.IGNORECASE)


def _looks_like_auth(text: str | None) -> bool:
    return bool(text) and bool(_AUTH_PATTERNS.search(text))


def _json_lines(text: str):
    """Yield every JSON object found one-per-line in text (other lines are skipped)."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            yield obj


def _last_json_object(text: str) -> dict | None:
    """The last top-level JSON object in text (whole text first, then line by line)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
            if isinstance(obj, dict):
                return obj
        except ValueError:
            pass
    found = None
    for obj in _json_lines(text):
        found = obj
    return found


def _model(flag: str, ctx: LaneContext) -> list[str]:
    return [flag, ctx.model] if ctx.model else []


class _Base:
    name = ""
    default_bin = ""
    can_resume = True
    worktree_litter: tuple[str, ...] = ()
    # what logging in needs, copied from the user's state dirs into the task's private copy (files.private_state)
    login_files: tuple[str, ...] = ()

    # what the CLI obeys or runs from its state dirs besides the login files (instructions, settings with hooks,
    # plugins, commands; top-level names in a state dir): a task's lanes share their private state, so each lane
    # starts with none of these (files.private_state): one lane cannot leave them for the next (issue 34)
    obeyed_files: tuple[str, ...] = ()

    # what the CLI writes on a first start before any model turn, made once per binary by ``prime_argv`` and copied
    # into each fresh private state (agent.lanes.vendorstate): top-level file names in a state dir (fnmatch)
    template_files: tuple[str, ...] = ()

    def version_argv(self, bin: str) -> list[str]:
        return [bin, "--version"]

    def prime_argv(self, bin: str) -> list[str] | None:
        """A command that makes the CLI write its first-start state and stop, with no model turn (None: none)."""
        return None

    def state_paths(self, env: dict[str, str]) -> list[Path]:
        """What the CLI must write to keep and resume its session (its config/session dir); the sandbox binds
        these read-write.  ``env`` is the lane's environment (HOME and the vendor's variables)."""
        return []

    def read_only_state(self, env: dict[str, str]) -> dict[Path, dict[str, bytes]]:
        """Those of ``state_paths`` the sandbox binds read-only, each with the files the agent writes into its
        private copy beside the login files (files.private_state).  A lane writes nothing there, so a dir the CLI
        loads code from (plugins) holds nothing another lane of the task put in it."""
        return {}

    @staticmethod
    def _home(env: dict[str, str]) -> Path:
        return Path(env.get("HOME") or Path.home())

    def _no_session(self) -> Invocation:
        # The runner catches this and gives the lane one fresh retry instead (lanes/lane.py).
        raise AgentError(f"{self.name}: the first turn reported no session id; nothing to resume")

    def __repr__(self) -> str:
        return f"<vendor {self.name}>"


# --------------------------------------------------------------------------- codex


class Codex(_Base):
    """codex-cli: ``codex exec --json`` (JSONL events), Responses API.

    Session id: ``thread.started.thread_id``.  Usage: ``turn.completed.usage`` (tokens only; in
    0.171.0 a resumed turn reports the thread's cumulative tokens).  No dollar cost.
    Resume: ``codex exec resume <id>``; it does not remember the sandbox, so the write sandbox is
    passed again with ``-c sandbox_mode=...`` (without it a resumed implementer turns read-only).
    Its bundled skills (image generation, a skill installer that fetches from GitHub, ...) are off: a lane needs
    none, and in a run's fresh private state codex wrote them out every run (~80 of its ~110 files; issue 34).
    """

    name = "codex"
    default_bin = "codex"
    login_files = ("auth.json", "config.toml")
    obeyed_files = ("AGENTS.md", "AGENTS.override.md", "prompts", "rules", "skills")
    NO_SKILLS = ("-c", "skills.bundled.enabled=false")
    usage_cumulative = True       # run_lane replaces a resumed turn's usage instead of adding it
    # its six SQLite databases (state, logs, memories, queue, goals, ...), migrated: ~60-80 ms of a first start
    template_files = ("*.sqlite", "*.sqlite-wal")

    def prime_argv(self, bin: str) -> list[str] | None:
        # opens and migrates its databases, then refuses the sandbox's empty private /tmp (no trusted directory):
        # no session is looked up in a new state, no model is asked
        return [bin, "exec", "-C", "/tmp", *self.NO_SKILLS, "resume", "--last", "agent-prime"]

    @staticmethod
    def _sandbox(ctx: LaneContext) -> str:
        return "workspace-write" if ctx.writable else "read-only"

    def _last_file(self, ctx: LaneContext) -> Path:
        return ctx.run_dir / "codex-last-message.txt"

    def state_paths(self, env: dict[str, str]) -> list[Path]:
        return [Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else self._home(env) / ".codex"]

    def build(self, ctx: LaneContext) -> Invocation:
        last = self._last_file(ctx)
        last.unlink(missing_ok=True)
        argv = [ctx.bin, "exec", "--json", "-s", self._sandbox(ctx), "-C", str(ctx.cwd), *self.NO_SKILLS,
                "-o", str(last), *_model("-m", ctx), *ctx.extra_args, "-"]
        return Invocation(argv=argv, stdin_path=Path(ctx.spec_path))

    def build_resume(self, ctx: LaneContext, session_id: str | None, note_path: Path) -> Invocation:
        if not session_id:
            return self._no_session()
        last = self._last_file(ctx)
        last.unlink(missing_ok=True)
        argv = [ctx.bin, "exec", "resume", "--json", "-c", f'sandbox_mode="{self._sandbox(ctx)}"', *self.NO_SKILLS,
                "-o", str(last), *_model("-m", ctx), *ctx.extra_args, session_id, "-"]
        return Invocation(argv=argv, stdin_path=Path(note_path))

    def read_turn(self, stdout: str, stderr: str, exit_code: int | None, ctx: LaneContext) -> TurnOutput:
        session = None
        message = None
        usage: dict = {}
        errors: list[str] = []
        for ev in _json_lines(stdout):
            kind = ev.get("type")
            if kind == "thread.started":
                session = ev.get("thread_id") or session
            elif kind == "item.completed":
                item = ev.get("item") or {}
                if item.get("type") == "agent_message":
                    message = item.get("text") or ""
            elif kind == "turn.completed":
                usage = {k: v for k, v in (ev.get("usage") or {}).items() if isinstance(v, (int, float))}
            elif kind == "turn.failed":
                errors.append(((ev.get("error") or {}).get("message")) or "turn failed")
            elif kind == "error":
                errors.append(ev.get("message") or "error")
        if message is None:
            # stdout may have been cut at the size cap; -o still holds the final message.
            message = read_lane_file(self._last_file(ctx), parse=True)   # the lane wrote it: never through a link
        api_error = errors[-1] if errors else None
        if api_error is None and exit_code not in (0, None) and not message:
            api_error = crash_reason(stderr, exit_code)
        auth = _looks_like_auth(api_error) or ("Not logged in" in stderr)
        return TurnOutput(message=message or "", session_id=session, cost_usd=None, usage=usage,
                          auth_failed=auth, api_error=api_error)


# --------------------------------------------------------------------------- claude


class Claude(_Base):
    """Claude Code: ``claude -p --output-format json`` (one JSON result object), Messages API.

    Writable: ``--permission-mode acceptEdits`` and an explicit tool allowlist.  Read-only:
    ``--permission-mode dontAsk`` (anything not pre-approved is refused without asking), only
    read tools available (``--tools``) and Bash limited to git read commands.
    Resume: ``--resume <session_id>``.  Cost: ``total_cost_usd``.
    """

    name = "claude"
    default_bin = "claude"
    login_files = (".credentials.json", ".claude.json")
    obeyed_files = ("settings.json", "settings.local.json", "CLAUDE.md", "agents", "commands", "hooks",
                    "output-styles", "plugins", "skills")
    # its global config, made and migrated on a first start (a machine id, migrationVersion): ~14 ms of a start
    # whose config dir has none (an API-key login has no .claude.json to copy; bench/RESULTS.md); only where
    # CLAUDE_CONFIG_DIR is a dir (~/.claude.json is a file of its own)
    template_files = (".claude.json",)
    WRITE_TOOLS = "Bash,Edit,Write,MultiEdit,Read,Glob,Grep,NotebookEdit,TodoWrite"
    READ_TOOLS = "Read,Glob,Grep,Bash"

    def prime_argv(self, bin: str) -> list[str] | None:
        # writes and migrates .claude.json, lists no plugin and stops: no model, no session
        return [bin, "plugin", "list"]

    def state_paths(self, env: dict[str, str]) -> list[Path]:
        if env.get("CLAUDE_CONFIG_DIR"):
            return [Path(env["CLAUDE_CONFIG_DIR"])]
        home = self._home(env)
        return [home / ".claude", home / ".claude.json"]

    def _flags(self, ctx: LaneContext) -> list[str]:
        if ctx.writable:
            return ["--permission-mode", "acceptEdits", "--allowedTools", self.WRITE_TOOLS]
        allowed = ",".join(["Read", "Glob", "Grep"] + [f"Bash({c}:*)" for c in GIT_READ_COMMANDS])
        return ["--permission-mode", "dontAsk", "--tools", self.READ_TOOLS, "--allowedTools", allowed,
                "--disallowedTools", "Edit,Write,MultiEdit,NotebookEdit"]

    def build(self, ctx: LaneContext) -> Invocation:
        argv = [ctx.bin, "-p", "--output-format", "json", *self._flags(ctx), *_model("--model", ctx),
                *ctx.extra_args]
        return Invocation(argv=argv, stdin_path=Path(ctx.spec_path))

    def build_resume(self, ctx: LaneContext, session_id: str | None, note_path: Path) -> Invocation:
        if not session_id:
            return self._no_session()
        argv = [ctx.bin, "-p", "--output-format", "json", "--resume", session_id, *self._flags(ctx),
                *_model("--model", ctx), *ctx.extra_args]
        return Invocation(argv=argv, stdin_path=Path(note_path))

    def read_turn(self, stdout: str, stderr: str, exit_code: int | None, ctx: LaneContext) -> TurnOutput:
        doc = _last_json_object(stdout)
        if not doc or doc.get("type") != "result":
            err = crash_reason(stderr, exit_code, stdout.strip()[-300:])
            return TurnOutput(message="", session_id=(doc or {}).get("session_id"), cost_usd=None, usage={},
                              auth_failed=_looks_like_auth(stderr) or _looks_like_auth(stdout),
                              api_error=err or "no result from claude")
        usage = {k: v for k, v in (doc.get("usage") or {}).items() if isinstance(v, (int, float))}
        if isinstance(doc.get("num_turns"), int):
            usage["num_turns"] = doc["num_turns"]
        denials = doc.get("permission_denials") or []
        usage["permission_denials"] = len(denials)
        is_error = bool(doc.get("is_error"))
        subtype = doc.get("subtype") or ""
        result = doc.get("result") if isinstance(doc.get("result"), str) else ""
        api_error = None
        status = doc.get("api_error_status")
        if is_error or subtype != "success":
            api_error = f"claude {subtype or 'error'}" + (f" (HTTP {status})" if status else "") + (
                f": {result}" if result else "")
        auth = status in (401, 403) or (is_error and _looks_like_auth(result))
        cost = doc.get("total_cost_usd")
        return TurnOutput(message="" if is_error else result, session_id=doc.get("session_id"),
                          cost_usd=float(cost) if isinstance(cost, (int, float)) else None,
                          usage=usage, auth_failed=bool(auth), api_error=api_error)


# --------------------------------------------------------------------------- opencode


class OpenCode(_Base):
    """opencode: ``opencode run --format json`` (JSONL events with ``sessionID``).

    The spec goes on stdin (opencode appends stdin to the message).  Permissions are set per lane
    with ``OPENCODE_CONFIG_CONTENT`` (merged over the user's config, which keeps the provider):
    read-only lanes get ``edit: deny`` and bash limited to git read commands; its own file snapshots (a git repo it
    makes and fills in its data dir, for /undo) are off: the runner keeps the worktree's picture itself, and in a
    run's fresh private state they cost every run ~0.3-0.5 s of git work (issue 34).  Resume:
    ``--session <id>``.  Cost: sum of ``step_finish.part.cost``.
    """

    name = "opencode"
    default_bin = "opencode"
    login_files = ("auth.json", "opencode.json", "opencode.jsonc", "config.json")
    # its config dir is read-only besides (``read_only_state``); its cache dir holds the tools and npm packages it
    # downloads and runs (``bin/rg``, provider packages)
    obeyed_files = ("AGENTS.md", "agent", "agents", "command", "commands", "plugin", "plugins", "bin",
                    "node_modules", "package.json")
    PROMPT = "Follow the task specification below exactly; end with the final report it asks for."
    RESUME_PROMPT = "Read the note below and answer as it asks."

    # what opencode writes into a config dir that lacks it (its Config.ensureGitignore); a read-only one without it
    # ends the run ("Unknown: FileSystem.writeFile", exit 1)
    GITIGNORE = b"node_modules\npackage.json\npackage-lock.json\nbun.lock\n.gitignore"

    def state_paths(self, env: dict[str, str]) -> list[Path]:
        home = self._home(env)
        dirs = (("XDG_DATA_HOME", ".local/share"), ("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"),
                ("XDG_STATE_HOME", ".local/state"))
        return [(Path(env[var]) if env.get(var) else home / rel) / "opencode" for var, rel in dirs]

    def read_only_state(self, env: dict[str, str]) -> dict[Path, dict[str, bytes]]:
        # its config dir: opencode loads plugins, agents and commands from it, and starts a background npm install
        # into it when it is writable (~0.2 s of npm's Arborist at every start in a fresh state, issue 34); it
        # skips that install when the dir is not writable
        return {self.state_paths(env)[1]: {".gitignore": self.GITIGNORE}}

    @staticmethod
    def permissions(writable: bool) -> dict:
        if writable:
            return {"permission": {"edit": "allow", "bash": "allow", "webfetch": "allow"}}
        bash = {"*": "deny"}
        bash.update({f"{c}*": "allow" for c in GIT_READ_COMMANDS})
        return {"permission": {"edit": "deny", "bash": bash, "webfetch": "deny"}}

    def _inv(self, ctx: LaneContext, prompt: str, stdin: Path, extra: list[str]) -> Invocation:
        argv = [ctx.bin, "run", "--format", "json", "--dir", str(ctx.cwd), *extra, *_model("-m", ctx),
                *ctx.extra_args, prompt]
        env = {"OPENCODE_CONFIG_CONTENT": json.dumps({**self.permissions(ctx.writable), "snapshot": False})}
        return Invocation(argv=argv, stdin_path=Path(stdin), env=env)

    def build(self, ctx: LaneContext) -> Invocation:
        return self._inv(ctx, self.PROMPT, ctx.spec_path, [])

    def build_resume(self, ctx: LaneContext, session_id: str | None, note_path: Path) -> Invocation:
        if not session_id:
            return self._no_session()
        return self._inv(ctx, self.RESUME_PROMPT, note_path, ["--session", session_id])

    def read_turn(self, stdout: str, stderr: str, exit_code: int | None, ctx: LaneContext) -> TurnOutput:
        session = None
        texts: dict[str, list[str]] = {}
        order: list[str] = []
        cost = 0.0
        saw_cost = False
        usage = {"input": 0, "output": 0, "reasoning": 0, "cache_read": 0, "cache_write": 0}
        errors: list[str] = []
        auth = False
        for ev in _json_lines(stdout):
            session = ev.get("sessionID") or session
            part = ev.get("part") or {}
            kind = ev.get("type")
            if kind == "text" and part.get("text") is not None:
                mid = part.get("messageID") or ""
                if mid not in texts:
                    texts[mid] = []
                    order.append(mid)
                texts[mid].append(part["text"])
            elif kind == "step_finish":
                if isinstance(part.get("cost"), (int, float)):
                    cost += part["cost"]
                    saw_cost = True
                tokens = part.get("tokens") or {}
                for key in ("input", "output", "reasoning"):
                    usage[key] += int(tokens.get(key) or 0)
                usage["cache_read"] += int((tokens.get("cache") or {}).get("read") or 0)
                usage["cache_write"] += int((tokens.get("cache") or {}).get("write") or 0)
            elif kind == "error":
                err = ev.get("error") or {}
                data = err.get("data") or {}
                errors.append(f"{err.get('name') or 'error'}: {data.get('message') or err}")
                if data.get("statusCode") in (401, 403) or err.get("name") == "ProviderAuthError":
                    auth = True
        message = "".join(texts[order[-1]]) if order else ""
        api_error = errors[-1] if errors else None
        if api_error is None and exit_code not in (0, None) and not message:
            api_error = crash_reason(stderr, exit_code)
        auth = auth or _looks_like_auth(api_error)
        return TurnOutput(message=message, session_id=session, cost_usd=round(cost, 6) if saw_cost else None,
                          usage=usage, auth_failed=auth, api_error=api_error)


# --------------------------------------------------------------------------- aider


class Aider(_Base):
    """aider: chat completions via litellm; edits are SEARCH/REPLACE blocks in its reply.

    No session id, but a conversation file: the chat history lives in the lane's run dir and a
    repair turn reloads it with ``--restore-chat-history`` (the "session id" reported is that
    file's path; each turn's lane dir is fresh, so the runner carries the file's text over: ``carried``).  The last message is read from the per-turn LLM history file, not stdout
    (stdout mixes aider's own chatter after the reply).  Read-only: ``--dry-run`` (no file is
    written), no shell command suggestions, no repo map (its cache dir would land in the tree).
    Aider exits 0 on API failure: errors are read from its output.
    """

    name = "aider"
    default_bin = "aider"
    worktree_litter = WORKTREE_LITTER["aider"]
    COMMON = ("--yes-always", "--no-auto-commits", "--no-dirty-commits", "--no-check-update", "--no-analytics",
              "--no-pretty", "--no-stream", "--no-gitignore", "--no-show-model-warnings", "--no-detect-urls",
              "--no-show-release-notes", "--no-fancy-input")

    def state_paths(self, env: dict[str, str]) -> list[Path]:
        return [self._home(env) / ".aider"]      # its chat and LLM history files live in the run dir

    def chat_file(self, ctx: LaneContext) -> Path:
        return ctx.run_dir / "aider.chat.md"

    def carried(self, ctx: LaneContext) -> dict[str, str]:
        """What the next turn needs of this turn's lane dir (the conversation), as text read through
        ``read_lane_file``; the runner writes it into the next turn's fresh lane dir."""
        text = read_lane_file(self.chat_file(ctx), parse=True)      # the lane wrote it: never through a link
        return {self.chat_file(ctx).name: text} if text is not None else {}

    def _llm_log(self, ctx: LaneContext, new: bool) -> Path:
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        logs = sorted((p for p in ctx.run_dir.glob("aider.llm.*.log") if re.fullmatch(r"aider\.llm\.\d{1,6}\.log", p.name)),
                      key=lambda p: int(p.name.split(".")[2]))
        if not new:
            return logs[-1] if logs else ctx.run_dir / "aider.llm.1.log"
        # exists even if aider dies early, so read_turn never reads an old turn (made fresh: a link is replaced)
        return write_private(ctx.run_dir / f"aider.llm.{len(logs) + 1}.log", "")

    @staticmethod
    def _events_log(llm_log: Path) -> Path:
        """The turn's analytics event log (JSONL, written by aider itself): the structured record of its usage,
        cost and API errors, next to the turn's LLM log."""
        return llm_log.with_name(llm_log.name.replace("aider.llm.", "aider.events.").replace(".log", ".jsonl"))

    def _argv(self, ctx: LaneContext, chat: Path, message_file: Path, restore: bool) -> list[str]:
        llm_log = self._llm_log(ctx, new=True)
        argv = [ctx.bin, *_model("--model", ctx), *self.COMMON,
                "--chat-history-file", str(chat),
                "--input-history-file", str(ctx.run_dir / "aider.input.history"),
                "--llm-history-file", str(llm_log), "--analytics-log", str(self._events_log(llm_log))]
        if not ctx.writable:
            argv += ["--dry-run", "--no-suggest-shell-commands", "--map-tokens", "0"]
        if restore:
            argv.append("--restore-chat-history")
        return argv + [*ctx.extra_args, "--message-file", str(message_file)]

    def build(self, ctx: LaneContext) -> Invocation:
        chat = self.chat_file(ctx)
        chat.unlink(missing_ok=True)
        return Invocation(argv=self._argv(ctx, chat, Path(ctx.spec_path), restore=False))

    def build_resume(self, ctx: LaneContext, session_id: str | None, note_path: Path) -> Invocation:
        chat = self.chat_file(ctx)          # this run's own, never a path the session id names
        if not session_id or chat.is_symlink() or not chat.is_file():
            return self._no_session()
        return Invocation(argv=self._argv(ctx, chat, Path(note_path), restore=True))

    @staticmethod
    def last_response(llm_log: str) -> str | None:
        """The last ``LLM RESPONSE`` block of aider's LLM history file, role prefixes removed."""
        idx = llm_log.rfind("\nLLM RESPONSE ")
        if idx < 0:
            if not llm_log.startswith("LLM RESPONSE "):
                return None
            idx = 0
        lines = llm_log[idx:].lstrip("\n").splitlines()[1:]
        out = []
        for line in lines:
            if line.startswith("TO LLM "):
                break
            if line.startswith("ASSISTANT "):
                out.append(line[len("ASSISTANT "):])
            elif line == "ASSISTANT":
                out.append("")
        return "\n".join(out)

    @staticmethod
    def responses(llm_log: str) -> list[str]:
        """Every ``LLM RESPONSE`` block of a turn's LLM log (the model's words, as aider logged them)."""
        out = []
        for block in re.split(r"(?m)^(?=LLM RESPONSE |TO LLM )", llm_log):
            if block.startswith("LLM RESPONSE "):
                out.append(Aider.last_response(block) or "")
        return out

    @staticmethod
    def events(path: Path) -> list[dict]:
        """aider's own analytics events of one turn (``--analytics-log``): one JSON object per line."""
        out = []
        for line in (read_lane_file(path, parse=True) or "").splitlines():   # never through a link
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("properties"), dict):
                out.append(doc)
        return out

    def read_turn(self, stdout: str, stderr: str, exit_code: int | None, ctx: LaneContext) -> TurnOutput:
        """Usage, cost and API errors come from aider's structured event log, never from stdout, which echoes the
        model's reply (a reply quoting "Cost: $750" or "AuthenticationError" must not count). Only aider's own
        error lines are read from its output, with every line of the model's replies taken out first."""
        log = self._llm_log(ctx, new=False)
        text = read_lane_file(log, parse=True) or ""      # the lane wrote it: never through a link
        message = self.last_response(text)
        usage: dict = {}
        cost = None
        api_error = None
        for ev in self.events(self._events_log(log)):
            props = ev["properties"]
            if ev.get("event") == "message_send":
                for key, field in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
                    if isinstance(props.get(field), (int, float)):
                        usage[key] = usage.get(key, 0) + int(props[field])
                if isinstance(props.get("cost"), (int, float)):
                    cost = (cost or 0.0) + float(props["cost"])
            elif ev.get("event") == "message_send_exception":
                api_error = str(props.get("exception") or "aider: the model call failed")[:500]
        # aider echoes each reply to stdout (wrapped at its terminal width): cut the replies out, whitespace-blind
        own = " ".join((stdout + "\n" + stderr).split())
        for reply in sorted(self.responses(text), key=len, reverse=True):
            flat = " ".join(reply.split())
            if flat:
                own = own.replace(flat, "\x00")
        m = None if api_error else re.search(r"(litellm\.\w+(?:Error|Exception)\b[^\x00]*|The API provider [^\x00]*)",
                                             own)
        if m:
            api_error = m.group(1).strip()[:500]
        elif exit_code not in (0, None) and message is None:
            api_error = crash_reason(stderr, exit_code)
        auth = "AuthenticationError" in (api_error or "") or (api_error is not None and _looks_like_auth(api_error))
        chat = self.chat_file(ctx)
        return TurnOutput(message=message or "", session_id=str(chat) if chat.is_file() and not chat.is_symlink() else None,
                          cost_usd=cost, usage=usage, auth_failed=auth, api_error=api_error)


# --------------------------------------------------------------------------- grok


class Grok(_Base):
    """@vibe-kit/grok-cli: ``grok -d <repo> -p <prompt>`` prints the conversation as JSONL.

    No prompt-file flag: the spec is passed inline when it fits on argv, otherwise the prompt
    names the spec file.  No session, no resume (a repair is a fresh retry), no cost.  No
    read-only mode at all (its tools always include bash and file edits) and it always writes
    ``.grok/settings.json`` into the worktree, so a read-only role is refused at build time.
    Exit code is 0 even on API errors: they appear as an assistant message "Sorry, I encountered
    an error: ...".  Never pass -k/-u: grok persists them to ~/.grok.
    """

    name = "grok"
    default_bin = "grok"
    login_files = ("user-settings.json",)
    can_resume = False
    worktree_litter = WORKTREE_LITTER["grok"]
    INLINE_MAX = 100_000      # bytes; Linux caps one argv string at 128 KiB

    def state_paths(self, env: dict[str, str]) -> list[Path]:
        return [self._home(env) / ".grok"]

    def build(self, ctx: LaneContext) -> Invocation:
        if not ctx.writable:
            raise AgentError(f"grok has no read-only mode; configure another vendor for the {ctx.role} lane")
        spec = Path(ctx.spec_path)
        text = spec.read_text(encoding="utf-8", errors="replace")
        if len(text.encode()) > self.INLINE_MAX:
            text = (f"Your task specification is in the file {spec} (too long to include here). "
                    "Read it with view_file, follow it exactly, and end with the final report it asks for.")
        argv = [ctx.bin, "-d", str(ctx.cwd), *_model("-m", ctx), *ctx.extra_args, "-p", text]
        return Invocation(argv=argv)

    def build_resume(self, ctx: LaneContext, session_id: str | None, note_path: Path) -> Invocation:
        return self._no_session()

    def read_turn(self, stdout: str, stderr: str, exit_code: int | None, ctx: LaneContext) -> TurnOutput:
        message = ""
        api_error = None
        for ev in _json_lines(stdout):
            if ev.get("role") != "assistant" or ev.get("tool_calls"):
                continue
            content = ev.get("content") or ""
            if content.startswith("Sorry, I encountered an error:"):
                api_error = content
                message = ""
            else:
                message = content
                api_error = None
        if api_error is None and exit_code not in (0, None) and not message:
            api_error = crash_reason(stderr, exit_code)
        auth = _looks_like_auth(api_error) or "API key required" in stderr
        return TurnOutput(message=message, session_id=None, cost_usd=None, usage={}, auth_failed=auth,
                          api_error=api_error)


# --------------------------------------------------------------------------- gemini


class Gemini(_Base):
    """gemini-cli (@google/gemini-cli 0.61.0): ``gemini --skip-trust -o json --approval-mode M -p <prompt>``.

    Driven for real against a scripted Gemini API server by tests/test_vendor_clis.py.
    - stdin is prepended to the -p prompt, so the spec goes on stdin and -p is a short pointer.
    - ``--skip-trust`` is required: headless gemini refuses an untrusted folder (exit 55), and
      without trust it silently downgrades yolo to default.  (It also means the worktree's own
      ``.gemini/settings.json`` is honoured, like every other CLI honours its repo config.)
    - Writable: ``--approval-mode yolo`` (auto_edit would not offer the shell the implementer
      needs).  Read-only: ``--approval-mode default``: headless, every tool that needs approval is
      not even offered to the model (no run_shell_command, replace, write_file); ``plan`` is not
      used because it offers write_file (into its plans dir) and exit_plan_mode.
    - Output: ONE pretty-printed JSON document ``{session_id, response, stats, error?}`` on
      stdout; ``response`` is the text after the last tool call (the last message).  A FATAL
      error (auth, HTTP 4xx from the API) prints ``{session_id, error: {type, message, code}}``
      to STDERR instead, among other stderr lines, and exits with the code mod 256 (41 = auth
      config, 42 = input e.g. unknown session to resume, 401 -> 145, ...).  Non-fatal stream
      errors (empty model reply) come on stdout with exit 0 and ``error.type`` INVALID_STREAM.
    - Usage: ``stats.models.<model>.tokens`` {input, prompt, candidates, total, cached, thoughts,
      tool} summed over models (per invocation), plus ``tool_calls``.  No dollar cost.
    - Session: ``session_id`` (a uuid, also present in error documents).  Resume: ``-r <uuid>``
      (cwd must be the same project: sessions are kept per project under ~/.gemini/tmp/<dir>);
      resuming a session that never completed a turn fails with exit 42.
    - Base URL for a gateway/local model: ``GOOGLE_GEMINI_BASE_URL``; with it alone the CLI picks
      the "gateway" auth type that 0.61.0's headless check rejects (exit 41), so set
      ``security.auth.selectedType: gemini-api-key`` in settings (``GEMINI_CLI_HOME`` moves ~/.gemini).
    """

    name = "gemini"
    default_bin = "gemini"
    login_files = ("settings.json", "oauth_creds.json", "google_accounts.json", "installation_id")
    obeyed_files = ("GEMINI.md", "commands", "extensions")
    PROMPT = "Follow the task specification above exactly; end with the final report it asks for."
    RESUME_PROMPT = "Answer the note above."
    _AUTH = re.compile(r"API key not valid|API_KEY_INVALID|UNAUTHENTICATED|PERMISSION_DENIED", re.IGNORECASE)

    def state_paths(self, env: dict[str, str]) -> list[Path]:
        return [(Path(env["GEMINI_CLI_HOME"]) if env.get("GEMINI_CLI_HOME") else self._home(env)) / ".gemini"]

    def _argv(self, ctx: LaneContext, prompt: str, extra: list[str]) -> list[str]:
        mode = "yolo" if ctx.writable else "default"
        return [ctx.bin, "--skip-trust", "-o", "json", "--approval-mode", mode, *extra, *_model("-m", ctx),
                *ctx.extra_args, "-p", prompt]

    def build(self, ctx: LaneContext) -> Invocation:
        return Invocation(argv=self._argv(ctx, self.PROMPT, []), stdin_path=Path(ctx.spec_path))

    def build_resume(self, ctx: LaneContext, session_id: str | None, note_path: Path) -> Invocation:
        if not session_id:
            return self._no_session()
        return Invocation(argv=self._argv(ctx, self.RESUME_PROMPT, ["-r", session_id]),
                          stdin_path=Path(note_path))

    @staticmethod
    def _documents(text: str) -> list[dict]:
        """Top-level JSON objects that start a line in text (pretty-printed ones included)."""
        decoder = json.JSONDecoder()
        docs = []
        pos = 0
        while True:
            idx = 0 if pos == 0 and text.startswith("{") else text.find("\n{", pos)
            if idx < 0:
                return docs
            start = idx if text.startswith("{", idx) else idx + 1
            try:
                obj, end = decoder.raw_decode(text, start)
            except ValueError:
                pos = start + 1
                continue
            if isinstance(obj, dict):
                docs.append(obj)
            pos = end

    def read_turn(self, stdout: str, stderr: str, exit_code: int | None, ctx: LaneContext) -> TurnOutput:
        docs = [d for d in self._documents(stdout) if "session_id" in d or "response" in d or "error" in d]
        if not docs:       # fatal errors go to stderr
            docs = [d for d in self._documents(stderr) if "error" in d]
        doc = docs[-1] if docs else {}
        stats = doc.get("stats") or {}
        usage: dict = {}
        for model in (stats.get("models") or {}).values():
            for key, val in ((model or {}).get("tokens") or {}).items():
                if isinstance(val, (int, float)):
                    usage[key] = usage.get(key, 0) + val
        calls = (stats.get("tools") or {}).get("totalCalls")
        if isinstance(calls, int):
            usage["tool_calls"] = calls
        err = doc.get("error")
        code = None
        api_error = None
        if isinstance(err, dict):
            code = err.get("code")
            api_error = f"{err.get('type') or 'error'}: {err.get('message') or ''}".strip()
            if code is not None:
                api_error += f" (code {code})"
        elif err:
            api_error = str(err)
        elif exit_code not in (0, None) and not doc.get("response"):
            api_error = crash_reason(stderr, exit_code)
        auth = (exit_code == 41 or code in (41, 401, 403)
                or bool(api_error and (self._AUTH.search(api_error) or _looks_like_auth(api_error))))
        message = doc.get("response") if isinstance(doc.get("response"), str) else ""
        return TurnOutput(message=message if not err else "", session_id=doc.get("session_id"), cost_usd=None,
                          usage=usage, auth_failed=bool(auth), api_error=api_error)


ADAPTERS = {v.name: v for v in (Codex(), Claude(), OpenCode(), Aider(), Grok(), Gemini())}   # read by vendors.VENDORS
