"""The HTML report's page: one self-contained file, inline CSS and JS, no external assets; verdicts as
coloured badges."""
from __future__ import annotations

import html

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2330;background:#fafbfc}
h1{font-size:20px;margin:0 0 4px}code,pre{font:12px/1.4 ui-monospace,monospace}
.meta{color:#555;margin-bottom:16px}.card{background:#fff;border:1px solid #dde1e6;border-radius:6px;
padding:12px 16px;margin:12px 0}.culprit{border-left:6px solid #c62828}
.timeline{display:flex;gap:2px;overflow-x:auto;padding:22px 4px 6px;align-items:flex-end}
.c{flex:1 0 10px;max-width:38px;height:34px;border-radius:3px;background:#d5d9de;border:0;padding:0;
position:relative}.c.tested{cursor:pointer;height:46px}.c.good{background:#2e7d32}.c.bad{background:#c62828}
.c.skip{background:#f9a825}.c.candidate{outline:2px dashed #6a1b9a;outline-offset:1px}
.c.culprit{outline:3px solid #111;outline-offset:2px}
.c.culprit::after{content:"▼";position:absolute;top:-17px;left:50%;transform:translateX(-50%);font-size:11px}
.c.sel{box-shadow:0 0 0 3px #1565c0}.axis{display:flex;justify-content:space-between;color:#666;font-size:12px}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:12px;height:12px;
border-radius:2px;margin-right:4px;vertical-align:-1px}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #e4e7eb;padding:5px 8px;
text-align:left;vertical-align:top}tr.pick{cursor:pointer}tr.pick:hover{background:#f0f4f8}
.v{font-weight:600;border-radius:3px;padding:1px 6px;color:#fff;white-space:nowrap}.v.good{background:#2e7d32}
.v.bad{background:#c62828}.v.skip{background:#f9a825;color:#222}.v.other{background:#607d8b}
pre.log{background:#14171c;color:#e6e6e6;padding:10px;border-radius:4px;max-height:420px;overflow:auto;
white-space:pre-wrap}
"""
_JS = """
function show(id){document.querySelectorAll('.detail').forEach(d=>d.hidden=d.id!==id);
document.querySelectorAll('[data-target]').forEach(e=>e.classList.toggle('sel',e.dataset.target===id));}
document.querySelectorAll('[data-target]').forEach(e=>e.addEventListener('click',()=>show(e.dataset.target)));
"""
# Every verdict the tool produces: step verdicts, a performance hunt's (bisector.report.perf.step_verdict),
# then backport verdicts (bisector.record.backport_results.VERDICTS).
_TONES = {"good": "good", "bad": "bad", "skip": "skip", "like good": "good", "like bad": "bad", "undecided": "skip",
          "verified": "good", "not-affected": "good", "already-fixed": "good", "contains": "good",
          "already-picked": "good", "applies-unverified": "skip", "conflict": "bad",
          "fix-ineffective": "bad", "masked": "bad", "not-exercised": "skip", "untestable": "skip"}


def _tone(verdict: object) -> str:
    return _TONES.get(str(verdict).lower(), "other")


def badge(verdict: object) -> str:
    """A verdict as a badge coloured by its tone (good, bad, skip, other); None as a dash."""
    if verdict is None:
        return "—"
    return f'<span class="v {_tone(verdict)}">{html.escape(str(verdict))}</span>'


def page(title: str, body: str) -> str:
    """The whole HTML document: title, the inline style and script around body."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n"
            f"<body>\n{body}\n<script>{_JS}</script>\n</body></html>\n")
