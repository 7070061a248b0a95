"""`agent bench report`: fix rate per vendor with a 95% confidence interval, cost and time per resolved case, and a
per-case table, read from the ``result.json`` files of one or more bench folders (two folders side by side: vendor A
vs B, or before vs after a config change). Text, JSON, or an HTML page with a chart (pygal)."""

from __future__ import annotations

import html
import json
import math
import statistics
from pathlib import Path

from agent import AgentError

Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (good at small n and at 0 or n)."""
    if n == 0:
        return 0.0, 0.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    low, high = max(0.0, mid - half), min(1.0, mid + half)
    return (0.0 if k == 0 else low), (1.0 if k == n else high)   # exact at the ends, not 0.9999999


def load_results(folder: Path) -> list[dict]:
    folder = Path(folder)
    if not (folder / "runs").is_dir():
        raise AgentError(f"{folder}: no runs/ folder; pass the --out folder of `agent bench run`")
    out = []
    for path in sorted((folder / "runs").glob("*/*/*/result.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and "case" in doc and "vendor" in doc:
            out.append(doc)
    return out


def summarize(folders: list[Path]) -> dict:
    """One row per (folder, vendor); labels carry the folder's name when there are two or more folders."""
    rows, cases = [], {}
    for folder in folders:
        results = load_results(folder)
        for vendor in sorted({r["vendor"] for r in results}):
            mine = [r for r in results if r["vendor"] == vendor]
            won = [r for r in mine if r.get("resolved")]
            low, high = wilson(len(won), len(mine))
            label = vendor if len(folders) == 1 else f"{Path(folder).name}:{vendor}"
            rows.append({
                "label": label, "folder": str(folder), "vendor": vendor, "runs": len(mine), "resolved": len(won),
                "rate": len(won) / len(mine) if mine else 0.0, "ci95": [round(low, 4), round(high, 4)],
                "median_cost_usd_resolved": _median([r.get("cost_usd") or 0 for r in won]),
                "median_wall_s_resolved": _median([r.get("wall_s") or 0 for r in won]),
                "total_cost_usd": round(sum(r.get("cost_usd") or 0 for r in mine), 4),
                "median_rounds": _median([r.get("rounds") or 0 for r in mine]),
            })
            for r in mine:
                cell = cases.setdefault(r["case"], {}).setdefault(label, {"runs": 0, "resolved": 0, "why": []})
                cell["runs"] += 1
                cell["resolved"] += 1 if r.get("resolved") else 0
                if not r.get("resolved") and r.get("why"):
                    cell["why"].append(r["why"])
    if not rows:
        raise AgentError("no finished runs in " + ", ".join(map(str, folders)) + "; run `agent bench run` first")
    return {"vendors": rows, "cases": cases}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def render_text(summary: dict) -> str:
    lines = [f"{'vendor':<28} {'fixed':>9} {'rate':>6} {'95% CI':>13} {'$/fix':>8} {'s/fix':>7} {'rounds':>6}"]
    for v in summary["vendors"]:
        cost = v["median_cost_usd_resolved"]
        wall = v["median_wall_s_resolved"]
        lines.append(f"{v['label'][:28]:<28} {v['resolved']:>4}/{v['runs']:<4} {v['rate']:>6.0%} "
                     f"{v['ci95'][0]:>5.0%}-{v['ci95'][1]:<6.0%} {'-' if cost is None else f'{cost:.2f}':>8} "
                     f"{'-' if wall is None else f'{wall:.0f}':>7} {v['median_rounds'] or 0:>6}")
    labels = [v["label"] for v in summary["vendors"]]
    lines += ["", "per case (resolved/runs):", f"{'case':<32} " + " ".join(f"{lab[:14]:>14}" for lab in labels)]
    for case, cells in sorted(summary["cases"].items()):
        row = []
        for lab in labels:
            c = cells.get(lab)
            row.append(f"{c['resolved']}/{c['runs']}" if c else "-")
        lines.append(f"{case[:32]:<32} " + " ".join(f"{x:>14}" for x in row))
    return "\n".join(lines)


def render_html(summary: dict) -> str:
    try:
        import pygal
    except ImportError:
        raise AgentError("the HTML report draws its chart with pygal: pip install 'agent-fixer[bench]'") from None
    chart = pygal.Bar(title="Fix rate with 95% confidence interval", range=(0, 100), show_legend=False,
                      value_formatter=lambda x: f"{x:.0f}%", width=720, height=360,
                      disable_xml_declaration=True, js=[])
    chart.x_labels = [v["label"] for v in summary["vendors"]]
    chart.add("fix rate", [{"value": round(v["rate"] * 100, 1),
                            "ci": {"low": v["ci95"][0] * 100, "high": v["ci95"][1] * 100}}
                           for v in summary["vendors"]])
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in ("vendor", "fixed", "rate", "95% CI", "$ per fix (median)",
                                                  "s per fix (median)", "rounds (median)"))
    body = "".join(
        f"<tr><td>{esc(v['label'])}</td><td>{v['resolved']}/{v['runs']}</td><td>{v['rate']:.0%}</td>"
        f"<td>{v['ci95'][0]:.0%}-{v['ci95'][1]:.0%}</td><td>{_fmt(v['median_cost_usd_resolved'], '.2f')}</td>"
        f"<td>{_fmt(v['median_wall_s_resolved'], '.0f')}</td><td>{v['median_rounds'] or 0}</td></tr>"
        for v in summary["vendors"])
    labels = [v["label"] for v in summary["vendors"]]
    case_rows = "".join(
        f"<tr><td>{esc(case)}</td>" + "".join(
            f"<td title='{esc('; '.join(cells[lab]['why'])[:500]) if lab in cells else ''}'>"
            f"{cells[lab]['resolved']}/{cells[lab]['runs']}</td>" if lab in cells else "<td>-</td>"
            for lab in labels) + "</tr>"
        for case, cells in sorted(summary["cases"].items()))
    return ("<!doctype html><html><head><meta charset='utf-8'><title>agent bench</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
            "</style></head><body><h1>agent bench</h1>"
            f"{chart.render(is_unicode=True)}<table><tr>{head}</tr>{body}</table>"
            f"<h2>Per case (resolved/runs)</h2><table><tr><th>case</th>"
            + "".join(f"<th>{esc(lab)}</th>" for lab in labels) + f"</tr>{case_rows}</table></body></html>\n")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)
