"""Where the pinned vendor CLIs live, and how to point each one at a FakeModel (env + config files).

Binaries come from ``scripts/ci-vendors`` (npm prefix ``.cache/vendor-clis``; aider in its own
venv there).  ``VENDOR_CLIS_PREFIX`` overrides the prefix.  Every CLI's home/config/state dir is
put under the test's tmp dir, keys are dummies, base URLs point at 127.0.0.1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# vendor -> (path under the prefix, pinned version string its --version prints, install hint)
PINNED = {
    "codex": ("node_modules/.bin/codex", "0.171.0", "@openai/codex@0.171.0"),
    "claude": ("node_modules/.bin/claude", "2.1.197", "@anthropic-ai/claude-code@2.1.197"),
    "opencode": ("node_modules/.bin/opencode", "1.18.33", "opencode-ai@1.18.33"),
    "grok": ("node_modules/.bin/grok", None, "@vibe-kit/grok-cli@0.0.34"),   # prints 1.0.1 whatever the pin
    "aider": ("aider/bin/aider", "0.86.2", "aider-chat==0.86.2"),
    "gemini": ("node_modules/.bin/gemini", "0.61.0", "@google/gemini-cli@0.61.0"),
}

MODELS = {
    "codex": "fake-model",
    "claude": "claude-fake",
    "opencode": "fake/fake-model",
    "grok": "fake-model",
    "aider": "openai/fake-model",
    "gemini": "fake-model",          # an explicit model also skips gemini-cli's routing (classifier) call
}


def prefix() -> Path:
    return Path(os.environ.get("VENDOR_CLIS_PREFIX") or ROOT / ".cache" / "vendor-clis")


def find_cli(name: str) -> tuple[Path | None, str]:
    """(binary path or None, why not) for a pinned vendor CLI."""
    rel, _, pkg = PINNED[name]
    path = prefix() / rel
    if path.exists() and os.access(path, os.X_OK):
        return path, ""
    return None, (f"{name} CLI not installed at {path} ({pkg}); run scripts/ci-vendors "
                  f"(the registry may have been unreachable)")


def setup_env(name: str, url: str, tmp: Path) -> dict[str, str]:
    """Environment variables (to set in the parent) that point CLI ``name`` at ``url``; writes its
    config files under ``tmp``.  The keys returned are what ``vendors.NAME.env`` must list."""
    tmp.mkdir(parents=True, exist_ok=True)
    if name == "codex":
        home = tmp / "codex-home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            'model_provider = "fake"\n'
            "check_for_update_on_startup = false\n"
            "[analytics]\nenabled = false\n"
            "[model_providers.fake]\n"
            'name = "fake"\n'
            f'base_url = "{url}/v1"\n'
            'env_key = "FAKE_API_KEY"\n'
            'wire_api = "responses"\n'
            "request_max_retries = 0\n"
            "stream_max_retries = 0\n")
        # codex refuses to install its sandbox helper (codex-linux-sandbox, which it runs under
        # bubblewrap when /usr/bin/bwrap exists) inside the temp dir; test homes live under /tmp,
        # so the lane gets its own TMPDIR, as a real user's CODEX_HOME (~/.codex) is not in /tmp.
        tmpdir = tmp / "codex-tmp"
        tmpdir.mkdir(exist_ok=True)
        return {"CODEX_HOME": str(home), "FAKE_API_KEY": "dummy", "TMPDIR": str(tmpdir)}
    if name == "claude":
        return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "dummy",
                "CLAUDE_CONFIG_DIR": str(tmp / "claude-config"), "CLAUDE_CODE_MAX_RETRIES": "0",
                "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    if name == "opencode":
        cfg = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {"fake": {
                "npm": "@ai-sdk/openai-compatible", "name": "Fake",
                "options": {"baseURL": f"{url}/v1", "apiKey": "{env:FAKE_API_KEY}"},
                "models": {"fake-model": {"name": "Fake", "cost": {"input": 1.0, "output": 2.0}}}}},
            "model": "fake/fake-model", "small_model": "fake/fake-model",
            "autoupdate": False, "share": "disabled"}
        path = tmp / "opencode.json"
        path.write_text(json.dumps(cfg))
        xdg = tmp / "xdg"
        return {"OPENCODE_CONFIG": str(path), "FAKE_API_KEY": "dummy",
                "XDG_DATA_HOME": str(xdg / "data"), "XDG_CONFIG_HOME": str(xdg / "config"),
                "XDG_CACHE_HOME": str(xdg / "cache"), "XDG_STATE_HOME": str(xdg / "state"),
                "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    if name == "grok":
        return {"GROK_API_KEY": "dummy", "GROK_BASE_URL": f"{url}/v1"}
    if name == "aider":
        return {"OPENAI_API_KEY": "dummy", "OPENAI_API_BASE": f"{url}/v1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    if name == "gemini":
        # GOOGLE_GEMINI_BASE_URL alone selects the "gateway" auth type, which 0.61.0's headless
        # auth check rejects ("Invalid auth method selected", exit 41); pinning the API-key auth
        # type in the user settings keeps the base URL override (the genai client reads it).
        home = tmp / "gemini-home"
        (home / ".gemini").mkdir(parents=True, exist_ok=True)
        (home / ".gemini" / "settings.json").write_text(json.dumps({
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True}}))
        tmpdir = tmp / "gemini-tmp"      # it writes error reports to os.tmpdir()
        tmpdir.mkdir(exist_ok=True)
        return {"GEMINI_API_KEY": "dummy", "GOOGLE_GEMINI_BASE_URL": url, "GEMINI_CLI_HOME": str(home),
                "TMPDIR": str(tmpdir)}
    raise KeyError(name)
