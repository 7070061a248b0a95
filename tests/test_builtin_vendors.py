"""Vendor adapters without running a CLI: argv per role, resume rules, and read_turn on edge cases
the real-CLI tests (tests/test_vendor_clis.py) cannot provoke (truncated stdout, non-JSON output,
gemini's error documents on stderr).  The JSON shapes are the ones the pinned CLIs print."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import AgentError
from agent.lanes import vendors
from agent.lanes.builtin import ADAPTERS, Aider
from agent.lanes.protocol import LaneContext

NAMES = ("codex", "claude", "opencode", "aider", "grok", "gemini")


def ctx(tmp_path: Path, writable: bool, model: str | None = "m") -> LaneContext:
    spec = tmp_path / "spec.md"
    spec.write_text("do the thing\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return LaneContext(role="implementer" if writable else "reviewer", writable=writable, spec_path=spec,
                       cwd=tmp_path, model=model, bin="/bin/x", extra_args=("--extra",), run_dir=run_dir)


def test_registry_holds_every_builtin():
    assert set(NAMES) <= set(vendors.known_vendors())   # loads agent.lanes.builtin's ADAPTERS into VENDORS
    for name in NAMES:
        adapter = vendors.VENDORS[name]
        assert adapter.name == name and adapter.default_bin == name
        assert adapter.version_argv("/bin/x") == ["/bin/x", "--version"]


# (vendor, flags a writable lane must have, flags a read-only lane must have, flags it must NOT have)
ROLE_FLAGS = {
    "codex": (["-s", "workspace-write"], ["-s", "read-only"], ["workspace-write"]),
    "claude": (["--permission-mode", "acceptEdits"], ["--permission-mode", "dontAsk"], ["acceptEdits"]),
    "aider": ([], ["--dry-run", "--no-suggest-shell-commands"], []),
    "gemini": (["--approval-mode", "yolo"], ["--approval-mode", "default"], ["yolo", "plan"]),
}


def _contains(argv: list[str], seq: list[str]) -> bool:
    return any(argv[i:i + len(seq)] == seq for i in range(len(argv)))


@pytest.mark.parametrize("name", sorted(ROLE_FLAGS))
def test_role_flags(name, tmp_path):
    write, read, not_read = ROLE_FLAGS[name]
    w = ADAPTERS[name].build(ctx(tmp_path, True)).argv
    r = ADAPTERS[name].build(ctx(tmp_path, False)).argv
    assert _contains(w, write) if write else "--dry-run" not in w
    assert _contains(r, read)
    for bad in not_read:
        assert not any(bad in a for a in r), (bad, r)
    assert "--extra" in w and "--extra" in r       # vendors.X.args reach the CLI
    if name == "gemini":          # headless gemini exits 55 in an untrusted folder
        assert "--skip-trust" in w and "--skip-trust" in r
    if name == "claude":
        writers = {"Edit", "Write", "MultiEdit", "NotebookEdit"}
        assert not writers & set(r[r.index("--tools") + 1].split(","))
        allowed = r[r.index("--allowedTools") + 1].split(",")
        assert not (writers | {"Bash"}) & set(allowed), allowed      # Bash only as Bash(git diff:*) etc.
        assert "Bash(git diff:*)" in allowed
        assert "Edit" in r[r.index("--disallowedTools") + 1].split(",")


def test_opencode_permissions_by_role(tmp_path):
    w = ADAPTERS["opencode"].build(ctx(tmp_path, True))
    r = ADAPTERS["opencode"].build(ctx(tmp_path, False))
    wp = json.loads(w.env["OPENCODE_CONFIG_CONTENT"])["permission"]
    rp = json.loads(r.env["OPENCODE_CONFIG_CONTENT"])["permission"]
    assert wp["edit"] == "allow" and wp["bash"] == "allow"
    assert rp["edit"] == "deny" and rp["bash"]["*"] == "deny" and rp["bash"]["git diff*"] == "allow"
    assert "rm*" not in rp["bash"]


def test_codex_bundled_skills_off(tmp_path):
    """Issue 34: codex lanes run without its bundled skills (it wrote them into a run's fresh state each run)."""
    c = ctx(tmp_path, True)
    for inv in (ADAPTERS["codex"].build(c), ADAPTERS["codex"].build_resume(c, "sess-1", c.spec_path)):
        i = inv.argv.index("skills.bundled.enabled=false")
        assert inv.argv[i - 1] == "-c" and inv.argv.index("-") > i


def test_opencode_snapshots_off(tmp_path):
    """Issue 34: opencode's own snapshot repo (git init + add in its data dir) is not made: the runner keeps the
    worktree's picture, and a run's fresh private state would pay for it every run."""
    for writable in (True, False):
        assert json.loads(ADAPTERS["opencode"].build(ctx(tmp_path, writable)).env["OPENCODE_CONFIG_CONTENT"])[
            "snapshot"] is False


@pytest.mark.parametrize("name", ["codex", "claude", "opencode", "gemini"])
def test_spec_goes_on_stdin_not_argv(name, tmp_path):
    c = ctx(tmp_path, True)
    inv = ADAPTERS[name].build(c)
    assert inv.stdin_path == c.spec_path
    assert not any("do the thing" in a for a in inv.argv)


def test_grok_refuses_read_only_and_inlines_or_points_to_spec(tmp_path):
    with pytest.raises(AgentError, match="read-only"):
        ADAPTERS["grok"].build(ctx(tmp_path, False))
    c = ctx(tmp_path, True)
    assert ADAPTERS["grok"].build(c).argv[-2:] == ["-p", "do the thing\n"]
    c.spec_path.write_text("x" * 200_000)
    prompt = ADAPTERS["grok"].build(c).argv[-1]
    assert str(c.spec_path) in prompt and len(prompt) < 1000


@pytest.mark.parametrize("name", ["codex", "claude", "opencode", "gemini", "grok"])
def test_resume_without_session_raises_so_runner_retries_fresh(name, tmp_path):
    with pytest.raises(AgentError):
        ADAPTERS[name].build_resume(ctx(tmp_path, True), None, tmp_path / "note.md")


def test_resume_carries_session_and_note(tmp_path):
    note = tmp_path / "note.md"
    c = ctx(tmp_path, True)
    cl = ADAPTERS["claude"].build_resume(c, "sess-1", note)
    assert _contains(cl.argv, ["--resume", "sess-1"]) and cl.stdin_path == note
    assert _contains(cl.argv, ["--permission-mode", "acceptEdits"])
    oc = ADAPTERS["opencode"].build_resume(c, "ses_1", note)
    assert _contains(oc.argv, ["--session", "ses_1"]) and oc.stdin_path == note
    gm = ADAPTERS["gemini"].build_resume(c, "uuid-1", note)
    assert _contains(gm.argv, ["-r", "uuid-1"]) and gm.stdin_path == note


def test_aider_resume_restores_the_chat_file(tmp_path):
    c = ctx(tmp_path, True)
    first = ADAPTERS["aider"].build(c).argv
    chat = Path(first[first.index("--chat-history-file") + 1])
    assert chat.parent == c.run_dir and "--restore-chat-history" not in first
    with pytest.raises(AgentError):          # nothing was said yet: nothing to restore
        ADAPTERS["aider"].build_resume(c, None, tmp_path / "note.md")
    chat.write_text("#### hi\n")
    again = ADAPTERS["aider"].build_resume(c, str(chat), tmp_path / "note.md").argv
    assert "--restore-chat-history" in again and again[again.index("--message-file") + 1].endswith("note.md")
    # each turn has its own LLM log so read_turn never reads the previous turn's reply
    logs = [a for a in first + again if a.endswith(".log")]
    assert len(set(logs)) == 2


def test_aider_carries_its_chat_to_the_next_turn_as_text_never_through_a_link(tmp_path):
    """Each turn's lane dir is fresh: what aider's repair turn restores is the text the runner read of the last
    turn's chat file (read_lane_file), never the file itself, and nothing through a link."""
    c = ctx(tmp_path, True)
    assert ADAPTERS["aider"].carried(c) == {}
    (c.run_dir / "aider.chat.md").write_text("#### hi\n")
    assert ADAPTERS["aider"].carried(c) == {"aider.chat.md": "#### hi\n"}
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    (c.run_dir / "aider.chat.md").unlink()
    (c.run_dir / "aider.chat.md").symlink_to(secret)
    assert ADAPTERS["aider"].carried(c) == {}


def test_codex_read_turn_falls_back_to_last_message_file(tmp_path):
    c = ctx(tmp_path, True)
    ADAPTERS["codex"].build(c)
    (c.run_dir / "codex-last-message.txt").write_text("STATUS: complete\nSUMMARY: s\n")
    cut = '{"type":"thread.started","thread_id":"t-1"}\n{"type":"item.completed","item":{"type":"agent_mes'
    out = ADAPTERS["codex"].read_turn(cut, "", 0, c)
    assert out.session_id == "t-1" and out.message.startswith("STATUS: complete")
    failed = ('{"type":"thread.started","thread_id":"t-2"}\n'
              '{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized: bad key"}}\n')
    out = ADAPTERS["codex"].read_turn(failed, "", 1, c)
    assert out.auth_failed and "401" in out.api_error
    out = ADAPTERS["codex"].read_turn(failed.replace("401 Unauthorized: bad key", "500 Internal"), "", 1, c)
    assert not out.auth_failed and out.api_error


def test_claude_read_turn_errors(tmp_path):
    c = ctx(tmp_path, True)
    out = ADAPTERS["claude"].read_turn("segfault\n", "Error: something broke\n", 1, c)
    assert out.message == "" and out.api_error == "Error: something broke (exit 1)" and not out.auth_failed
    doc = {"type": "result", "subtype": "error_max_turns", "is_error": False, "result": "", "session_id": "s",
           "total_cost_usd": 0.5, "usage": {"input_tokens": 9}, "permission_denials": []}
    out = ADAPTERS["claude"].read_turn(json.dumps(doc), "", 0, c)
    assert "error_max_turns" in out.api_error and out.cost_usd == 0.5 and out.session_id == "s"


def test_opencode_message_is_last_assistant_message_only(tmp_path):
    c = ctx(tmp_path, True)
    lines = [
        {"type": "text", "sessionID": "ses_9", "part": {"messageID": "m1", "text": "thinking aloud"}},
        {"type": "step_finish", "sessionID": "ses_9", "part": {"cost": 0.25, "tokens": {"input": 5, "output": 1}}},
        {"type": "text", "sessionID": "ses_9", "part": {"messageID": "m2", "text": "STATUS: complete\n"}},
        {"type": "text", "sessionID": "ses_9", "part": {"messageID": "m2", "text": "SUMMARY: s\n"}},
        {"type": "step_finish", "sessionID": "ses_9", "part": {"cost": 0.5, "tokens": {"input": 7, "output": 2}}},
    ]
    out = ADAPTERS["opencode"].read_turn("\n".join(map(json.dumps, lines)), "", 0, c)
    assert out.message == "STATUS: complete\nSUMMARY: s\n"
    assert out.session_id == "ses_9" and out.cost_usd == 0.75 and out.usage["input"] == 12


def test_aider_last_response_parser():
    log = ("TO LLM 2026\nUSER hi\n\nLLM RESPONSE 2026\nASSISTANT first\n"
           "TO LLM 2026\nUSER again\n\nLLM RESPONSE 2026\nASSISTANT STATUS: complete\nASSISTANT \n"
           "ASSISTANT SUMMARY: s\n")
    assert Aider.last_response(log) == "STATUS: complete\n\nSUMMARY: s"
    assert Aider.last_response("TO LLM 2026\nUSER hi\n") is None


def test_aider_read_turn_usage_and_cost(tmp_path):
    c = ctx(tmp_path, True)
    argv = ADAPTERS["aider"].build(c).argv
    events = Path(argv[argv.index("--analytics-log") + 1])
    events.write_text("\n".join(json.dumps(e) for e in (
        {"event": "launched", "properties": {}},
        {"event": "message_send", "properties": {"prompt_tokens": 2500, "completion_tokens": 30, "cost": 0.01}},
    )) + "\n")
    # stdout's own token line (and any the model's reply quotes) is not read: the event log is
    out = ADAPTERS["aider"].read_turn("Tokens: 900k sent, 30 received. Cost: $750.00 message, $750 session.\n",
                                      "", 0, c)
    assert out.usage == {"input_tokens": 2500, "output_tokens": 30} and out.cost_usd == 0.01
    assert out.message == ""          # this turn's LLM log is empty: no reply, not the last turn's


def test_gemini_read_turn(tmp_path):
    c = ctx(tmp_path, True)
    doc = {"session_id": "g-1", "response": "STATUS: complete\nSUMMARY: s",
           "stats": {"models": {"gemini-x": {"tokens": {"prompt": 10, "candidates": 3}}}}}
    out = ADAPTERS["gemini"].read_turn(json.dumps(doc, indent=2), "", 0, c)
    assert out.session_id == "g-1" and out.message.startswith("STATUS") and out.usage == {"prompt": 10, "candidates": 3}
    err = {"error": {"type": "FatalAuthenticationError", "message": "no credentials", "code": 41}}
    out = ADAPTERS["gemini"].read_turn(json.dumps(err), "", 41, c)
    assert out.auth_failed and out.message == "" and "no credentials" in out.api_error


def test_gemini_error_documents(tmp_path):
    """gemini 0.61.0: a fatal API error prints a pretty JSON document to STDERR among log lines and
    exits with the HTTP code mod 256 (401 -> 145); a stream error comes on stdout with exit 0."""
    c = ctx(tmp_path, True)
    fatal = {"session_id": "u-1", "error": {"type": "Error", "code": 401, "message": json.dumps(
        {"error": {"code": 401, "message": "API key not valid. Please pass a valid API key.",
                   "status": "UNAUTHENTICATED"}})}}
    stderr = ("YOLO mode is enabled.\nError when talking to Gemini API {\"error\": 1}\n  status: 401\n}\n"
              + json.dumps(fatal, indent=2) + "\n")
    out = ADAPTERS["gemini"].read_turn("", stderr, 145, c)
    assert out.auth_failed and out.session_id == "u-1" and "API key not valid" in out.api_error
    # real Gemini answers a bad key with HTTP 400 INVALID_ARGUMENT / API_KEY_INVALID
    fatal["error"] = {"type": "Error", "code": 400, "message": "API key not valid. reason: API_KEY_INVALID"}
    assert ADAPTERS["gemini"].read_turn("", json.dumps(fatal, indent=2), 144, c).auth_failed
    # a non-auth fatal error is an api_error, not an auth failure
    fatal["error"] = {"type": "Error", "code": 500, "message": "Internal error"}
    out = ADAPTERS["gemini"].read_turn("", json.dumps(fatal, indent=2), 244, c)
    assert not out.auth_failed and "Internal error" in out.api_error
    stream = {"session_id": "u-2", "response": "", "stats": {"models": {"m": {"tokens": {"input": 5}}},
                                                             "tools": {"totalCalls": 2}},
              "error": {"type": "INVALID_STREAM", "message": "The model returned an empty response"}}
    out = ADAPTERS["gemini"].read_turn(json.dumps(stream, indent=2), "", 0, c)
    assert out.message == "" and out.api_error.startswith("INVALID_STREAM") and not out.auth_failed
    assert out.usage == {"input": 5, "tool_calls": 2} and out.session_id == "u-2"
    # resuming a session that never completed a turn: plain text on stderr, exit 42
    out = ADAPTERS["gemini"].read_turn("", "Error resuming session: No previous sessions found for this "
                                           "project.\n", 42, c)
    assert out.api_error.startswith("Error resuming session") and not out.auth_failed
