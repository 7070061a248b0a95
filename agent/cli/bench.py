"""`agent bench`: measure how often each lane vendor fixes production-style bugs, and at what cost."""

from __future__ import annotations

from pathlib import Path

import click

from agent.cli.common import json_option


@click.group()
def bench():
    """Benchmark lane vendors on bug cases: the real fixer path per case x vendor, verified by a hidden test.

    \b
    Example:
      agent bench run cases/ --vendor codex --vendor claude --repeat 3 --out bench-out
      agent bench report bench-out
      agent bench report before/ after/ --html report.html
    """


@bench.command("run")
@click.argument("cases", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--vendor", "vendors", multiple=True, required=True,
              help="A vendor to measure (repeat for several): a built-in (codex, claude, ...) or one defined "
                   "under vendors: in --config, optionally with a model (codex:gpt-5-codex). It is the implementer (and the decider when a case has no "
                   "brief), and every reviewer role --config's lanes: does not name.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 100), help="Runs per case and vendor.")
@click.option("--jobs", default=1, show_default=True, type=click.IntRange(1, 64), help="Runs at once.")
@click.option("--out", default="bench-out", show_default=True, type=click.Path(file_okay=False),
              help="Results folder: runs/<case>/<vendor>/<n>/result.json; a finished run is never run again.")
def run_cmd(cases, vendors, repeat, jobs, out):
    """Run CASES (case files or folders of them) for each --vendor, each run in a fresh home with the local forge.

    Vendor definitions, prices and sandbox settings come from the --config file given to `agent` (its repos and
    lanes are replaced per run). A killed run goes on where it stopped the next time; a progress line per run.

    \b
    Example:
      agent --config bench-vendors.yaml bench run cases/ --vendor codex --repeat 3 --jobs 2
    """
    from agent.app.bench.cases import load_cases
    from agent.app.bench.run import run_bench

    ctx = click.get_current_context()
    config_file = ctx.find_root().obj.config_file if ctx.find_root().obj is not None else None
    if config_file is not None:
        from agent.config import load_config

        load_config(config_file, required=True)    # a broken vendor config fails here, not in every run
    found = load_cases([Path(c) for c in cases])
    results = run_bench(found, list(vendors), Path(out), repeat=repeat, jobs=jobs, config_file=config_file,
                        echo=click.echo)
    won = sum(1 for r in results if r.get("resolved"))
    click.echo(f"{won} of {len(results)} run(s) resolved; `agent bench report {out}` for rates and costs")


@bench.command("one", hidden=True)
@click.argument("case_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--vendor", required=True)
@click.option("--dir", "folder", required=True, type=click.Path(file_okay=False))
@click.option("--cache", type=click.Path(file_okay=False))
@click.option("--base-config", type=click.Path(exists=True, dir_okay=False))
def one_cmd(case_file, vendor, folder, cache, base_config):
    """One run (what `bench run` starts in its own process); resumes a killed one.

    \b
    Example:
      agent bench one cases/widgets-qty.yaml --vendor codex --dir bench-out/runs/widgets-qty/codex/1
    """
    import yaml

    from agent.app.bench.run import run_one

    # `bench run` validated this file with load_config before starting any run
    base = (yaml.safe_load(Path(base_config).read_text(encoding="utf-8")) or {}) if base_config else {}
    run_one(Path(case_file), vendor, Path(folder), base, Path(cache) if cache else None, echo=click.echo)


@bench.command("report")
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@json_option
@click.option("--html", "html_file", type=click.Path(dir_okay=False), help="Also write an HTML page with a chart.")
def report_cmd(folders, as_json, html_file):
    """Fix rate per vendor (95% Wilson interval), median cost and time per fix, and a per-case table.

    Two or more FOLDERS are shown side by side (vendor A vs B, before vs after a config change).

    \b
    Example:
      agent bench report bench-out
      agent bench report before/ after/ --json
    """
    import json

    from agent.app.bench.report import render_html, render_text, summarize

    summary = summarize([Path(f) for f in folders])
    if html_file:
        Path(html_file).write_text(render_html(summary), encoding="utf-8")
    click.echo(json.dumps(summary, indent=2) if as_json else render_text(summary))


@bench.group("import")
def import_group():
    """Turn other benchmarks' instances into bench cases.

    \b
    Example:
      agent bench import swebench swe-bench-lite.jsonl --out cases/
    """


@import_group.command("swebench")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", default="cases", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the case files (one per instance; an existing one is kept).")
@click.option("--repo-root", type=click.Path(exists=True, file_okay=False),
              help="Offline: find each repository here (OWNER__NAME or NAME) instead of cloning from GitHub.")
@click.option("--test-command", default="python -m pytest -q -p no:cacheprovider --tb=native {tests}",
              show_default=True, help="How to run tests; {tests} becomes the test ids.")
@click.option("--setup", help="Command that prepares the environment before the tests (e.g. pip install -e .).")
def import_swebench(file, out_dir, repo_root, test_command, setup):
    """SWE-bench instances (JSON or JSONL) become cases: the hidden patch is test_patch, verification runs
    FAIL_TO_PASS plus PASS_TO_PASS, and the error is the FAIL_TO_PASS traceback at the base commit, captured once
    in the check sandbox.

    \b
    Example:
      agent bench import swebench instances.jsonl --out cases/ --setup "pip install -e ."
    """
    from agent.app.bench.swebench import import_instances
    from agent.config import Config, load_config

    if "{tests}" not in test_command:
        raise click.BadParameter("must contain {tests}", param_hint="--test-command")
    app = click.get_current_context().find_root().obj
    config = load_config(app.config_file, required=True) if app is not None and app.config_file else Config()
    written = import_instances(Path(file), Path(out_dir), config, repo_root=Path(repo_root) if repo_root else None,
                               test_command=test_command, setup=setup, echo=click.echo)
    click.echo(f"{len(written)} case(s) in {out_dir}")
