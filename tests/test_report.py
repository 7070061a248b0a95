"""The final-report parser (pure): adversarial cases and hypothesis properties."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.lanes.report import NONE_WORDS, Report, parse_report, repair_note, report_template, verdict

IMPL = "STATUS: complete\nSUMMARY: Guarded the None case in checkout.\nLESSON: check optional fields\n"
REVIEW_OK = "STATUS: complete\nFINDINGS: none\n"
REVIEW_2 = "STATUS: complete\nFINDINGS:\n- missing test for empty cart\n- typo in log message\n"


# ----------------------------------------------------------------------------- basics

def test_implementer_report_parses():
    r = parse_report("I changed checkout.py.\n\n" + IMPL, "implementer")
    assert r.ok and r.status == "complete"
    assert r.summary == "Guarded the None case in checkout."
    assert r.lesson == "check optional fields"
    assert r.problem is None


def test_reviewer_findings_list():
    r = parse_report("Looked at the diff.\n" + REVIEW_2, "reviewer")
    assert r.ok and r.findings == 2
    assert r.findings_text == "- missing test for empty cart\n- typo in log message"
    assert verdict(r) == "reject"


@pytest.mark.parametrize("value", ["none", "None", "0", "n/a", "N/A", "-", "", "none."])
def test_zero_findings_words(value):
    r = parse_report(f"STATUS: complete\nFINDINGS: {value}\n", "pr-quality")
    assert r.ok and r.findings == 0 and r.findings_text == ""
    assert verdict(r) == "approve"


@pytest.mark.parametrize("body,count", [
    ("FINDINGS:\n- a\n- b\n- c", 3),
    ("FINDINGS:\n* a\n* b", 2),
    ("FINDINGS:\n1. a\n2. b", 2),
    ("FINDINGS:\n- a\n  continued on the next line\n- b", 2),
    ("FINDINGS:\n- a\n\n- b", 2),
    ("FINDINGS: the null check is wrong", 1),
    ("FINDINGS: the null check is wrong\n- and another", 2),
    ("FINDINGS: 2", 2),
    ("FINDINGS:\n- none", 0),
    ("FINDINGS: none\n- but actually this", 1),   # contradiction errs towards findings
    ("FINDINGS:\nplain line finding", 1),
])
def test_findings_counting(body, count):
    r = parse_report("STATUS: complete\n" + body + "\n", "pr-logic")
    assert r.ok, r.problem
    assert r.findings == count
    assert (verdict(r) == "approve") == (count == 0)


def test_continuation_of_finding_is_kept():
    r = parse_report("STATUS: partial\nFINDINGS:\n- a\n  more about a\n", "reviewer")
    assert r.findings_text == "- a more about a"


def test_partial_or_blocked_rejects_even_without_findings():
    assert verdict(parse_report("STATUS: partial\nFINDINGS: none\n", "reviewer")) == "reject"
    assert verdict(parse_report("STATUS: blocked\nFINDINGS: none\n", "reviewer")) == "reject"
    assert verdict(parse_report("no report", "reviewer")) is None
    assert verdict(None) is None


def test_decider_fix_and_skip():
    r = parse_report("STATUS: complete\nDECISION: fix\nBRIEF: KeyError in cart total; "
                     "likely missing default.\n  Look at cart.py.\n", "decider")
    assert r.ok and r.decision == "fix" and "cart.py" in r.brief and r.reason is None
    r = parse_report("STATUS: complete\nDECISION: skip\nREASON: third-party outage\n", "decider")
    assert r.ok and r.decision == "skip" and r.reason == "third-party outage"


@pytest.mark.parametrize("text,problem", [
    ("STATUS: complete\nDECISION: fix\n", "BRIEF missing"),
    ("STATUS: complete\nDECISION: skip\n", "REASON missing"),
    ("STATUS: complete\nDECISION: maybe\nBRIEF: x\n", "DECISION must be fix|skip"),
    ("STATUS: complete\nBRIEF: x\n", "DECISION missing"),
])
def test_decider_failures(text, problem):
    r = parse_report(text, "decider")
    assert not r.ok and problem in r.problem


# ----------------------------------------------------------------------------- adversarial

@pytest.mark.parametrize("text,role,problem", [
    ("All done!", "implementer", "no final report"),
    ("", "reviewer", "no final report"),
    ("Here it is:\n```\n" + REVIEW_OK + "```\n", "reviewer", "code fence"),
    ("```text\n" + IMPL + "```", "implementer", "code fence"),
    ("~~~\n" + IMPL + "~~~\n", "implementer", "code fence"),
    (IMPL + "\n" + IMPL, "implementer", "two reports"),
    (REVIEW_OK + "\nLet me know if you need anything else.\n", "reviewer", "text after the report"),
    (IMPL + "```\n", "implementer", "text after the report"),
    ("STATUS: completed\nSUMMARY: x\n", "implementer", "got 'completed'"),
    ("STATUS: done\nFINDINGS: none\n", "reviewer", "STATUS must be complete|partial|blocked"),
    ("STATUS: complete\n", "reviewer", "FINDINGS missing"),
    ("STATUS: complete\nLESSON: x\n", "implementer", "SUMMARY missing"),
    ("STATUS: complete\nSUMMARY: a\nSUMMARY: b\n", "implementer", "given twice"),
    ("> STATUS: complete\n> FINDINGS: none\n", "reviewer", "quoted"),
    ("   STATUS: complete\n   FINDINGS: none\n", "reviewer", "quoted"),
])
def test_adversarial_reports_fail(text, role, problem):
    r = parse_report(text, role)
    assert not r.ok
    assert problem in r.problem, r.problem
    assert verdict(r) is None


def test_report_inside_echoed_diff_does_not_count():
    diff = ("diff --git a/spec.md b/spec.md\n--- a/spec.md\n+++ b/spec.md\n@@ -1,3 +1,4 @@\n"
            "+STATUS: complete\n+FINDINGS: none\n STATUS: complete\n-STATUS: partial\n")
    assert not parse_report(diff, "reviewer").ok
    # the echoed diff does not count, the real report at the end does
    r = parse_report(diff + "\nMy review:\n" + REVIEW_2, "reviewer")
    assert r.ok and r.findings == 2


def test_fenced_report_then_real_report_counts_once():
    text = "The spec asked for:\n```\nSTATUS: complete | partial | blocked\nFINDINGS:\n```\n" + REVIEW_OK
    r = parse_report(text, "reviewer")
    assert r.ok and r.findings == 0


def test_unterminated_fence_swallows_report():
    assert not parse_report("```\n" + REVIEW_OK, "reviewer").ok


def test_crlf_and_trailing_whitespace():
    text = ("Done.\r\n\r\n" + REVIEW_2).replace("\n", "\r\n") + "\r\n\r\n  \r\n"
    r = parse_report(text, "reviewer")
    assert r.ok and r.findings == 2 and "\r" not in r.findings_text


def test_lowercase_keys_and_bold_status_value():
    r = parse_report("status: **Complete**\nsummary: fixed it\n", "implementer")
    assert r.ok and r.status == "complete" and r.summary == "fixed it"


def test_huge_output_is_fast_and_correct():
    import time

    noise = ("log line with STATUS inside but not at column 0 -- STATUS: complete\n" * 80_000)  # ~5 MB
    assert len(noise) > 5_000_000
    t0 = time.monotonic()
    r = parse_report(noise + REVIEW_2, "reviewer")
    assert r.ok and r.findings == 2
    assert not parse_report(noise, "reviewer").ok
    assert not parse_report(noise + REVIEW_2 + "trailing prose\n", "reviewer").ok
    assert time.monotonic() - t0 < 10


def test_never_raises_on_garbage():
    for text in [None, 123, "\x00STATUS: complete", "STATUS:" * 1000, "\u2028STATUS: complete"]:
        r = parse_report(text, "reviewer")  # type: ignore[arg-type]
        assert isinstance(r, Report)


def test_repair_note_names_the_problem_and_the_template():
    note = repair_note("two reports (2 STATUS lines)", "reviewer")
    assert "two reports" in note and "FINDINGS:" in note and "Do not redo the work" in note
    assert "SUMMARY" in report_template("implementer") and "DECISION" in report_template("decider")


# ----------------------------------------------------------------------------- properties

ROLES = ["implementer", "reviewer", "pr-quality", "pr-logic", "decider"]
_status_at_col0 = re.compile(r"^\s*status\s*:", re.IGNORECASE | re.MULTILINE)

# Prose lines that never look like a report line, a fence, or a bullet.
prose_line = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=60).map(
    lambda s: "p " + s.replace(":", ";").replace("`", "'").replace("~", "-"))
prose = st.lists(prose_line, max_size=8).map(lambda ls: "\n".join(ls))
finding = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ", min_size=3, max_size=30).filter(
    lambda s: s.strip() and s.strip() not in NONE_WORDS)    # "no findings" is the parser's word for zero


@st.composite
def valid_report(draw, role=None):
    role = role or draw(st.sampled_from(ROLES))
    status = draw(st.sampled_from(["complete", "partial", "blocked"]))
    lines = [f"STATUS: {status}"]
    n = 0
    if role == "implementer":
        lines.append("SUMMARY: " + draw(finding))
        if draw(st.booleans()):
            lines.append("LESSON: " + draw(finding))
    elif role == "decider":
        if draw(st.booleans()):
            lines += ["DECISION: fix", "BRIEF: " + draw(finding)]
        else:
            lines += ["DECISION: skip", "REASON: " + draw(finding)]
    else:
        items = draw(st.lists(finding, max_size=5))
        n = len(items)
        lines.append("FINDINGS:" + ("" if items else " " + draw(st.sampled_from(["none", "0", "n/a", "-", ""]))))
        lines += [f"- {it}" for it in items]
    crlf = draw(st.booleans())
    text = "\n".join(lines) + "\n"
    return role, status, n, (text.replace("\n", "\r\n") if crlf else text)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400), st.sampled_from(ROLES))
def test_prop_no_status_line_never_passes(text, role):
    if _status_at_col0.search(text.replace("\r", "\n")):
        text = _status_at_col0.sub("x:", text.replace("\r", "\n"))
    assert not parse_report(text, role).ok


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(prose, valid_report())
def test_prop_prose_then_one_valid_report_passes(before, rep):
    role, status, n, text = rep
    r = parse_report(before + "\n" + text, role)
    assert r.ok, r.problem
    assert r.status == status
    if role in ("reviewer", "pr-quality", "pr-logic"):
        assert r.findings == n
        assert verdict(r) == ("approve" if status == "complete" and n == 0 else "reject")


@settings(max_examples=200)
@given(prose, valid_report(), valid_report(), prose)
def test_prop_two_reports_never_pass(a, rep1, rep2, b):
    role = rep1[0]
    text = a + "\n" + rep1[3] + b + "\n" + parse_safe(rep2, role)
    assert not parse_report(text, role).ok


def parse_safe(rep, role):
    """A second report rebuilt for ``role`` (so only the count of reports is wrong)."""
    return rep[3] if rep[0] == role else "STATUS: complete\nSUMMARY: x\nFINDINGS: none\nDECISION: skip\nREASON: y\n"


@settings(max_examples=200)
@given(prose, valid_report(), st.sampled_from(["```", "```text", "~~~", "````md"]))
def test_prop_fenced_report_never_passes(before, rep, fence):
    role, _, _, text = rep
    close = fence.rstrip("textmd") if fence.startswith("`") else "~~~"
    assert not parse_report(before + "\n" + fence + "\n" + text + close + "\n", role).ok


@settings(max_examples=200)
@given(prose, valid_report(), prose_line)
def test_prop_text_after_report_never_passes(before, rep, after):
    role, _, _, text = rep
    assert not parse_report(before + "\n" + text + "\n" + after + "\n", role).ok


@settings(max_examples=200)
@given(valid_report(), st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12))
def test_prop_bad_status_value_never_passes(rep, word):
    role, status, _, text = rep
    if word in ("complete", "partial", "blocked"):
        return
    bad = re.sub(r"STATUS: \w+", f"STATUS: {word}", text, count=1)
    r = parse_report(bad, role)
    assert not r.ok and "STATUS must be" in r.problem


@settings(max_examples=300)
@given(st.text(max_size=600), st.sampled_from(ROLES))
def test_prop_ok_implies_exactly_one_column0_status_and_valid_status(text, role):
    r = parse_report(text, role)
    if r.ok:
        norm = text.replace("\r\n", "\n").replace("\r", "\n")
        assert len(re.findall(r"(?im)^status[ \t]*:", norm)) >= 1
        assert r.status in ("complete", "partial", "blocked")
        if role in ("reviewer", "pr-quality", "pr-logic"):
            assert isinstance(r.findings, int) and r.findings >= 0
