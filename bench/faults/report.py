"""bench/results/faults.json and its readable table, faults.md."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HEADER = """# Fault benchmark

`make bench-faults` (`python -m bench.faults`) starts a fresh stack per fault kind (`running_stack`: private
redis-server, router, predictor, dispatcher, two workers of SIMULATED engines, a measuring instrument),
drives concurrent multi-stage workflows through the gRPC door with the SDK (about half the stages streamed,
the rest read whole: `final_only`, no deltas; "whole" counts those answered), strikes once a
quarter of the stages are answered, and counts what the clients saw. For `dispatcher_kill_replica` the stack
runs two dispatchers on the one Redis (`LauncherSettings.dispatchers`), the SDK is given both addresses, and
the one holding the reaper lease is killed. `make soak` runs one stack (two dispatchers, one engine's
crash knob armed) for minutes with a random fault of any kind every 30-60 s. Rerun a subset:
`python -m bench.faults --kinds worker_kill redis_kill --workflows 16 --seed 1`.

Columns: **completed**; **failed (retryable)**: ended by UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED
or ABORTED (the codes are listed); **failed (other)**: any other status; **lost**: no answer and no error
(hung past the client's timeout, a stream that ended without a final, an unrequested `cancelled`, an empty
answer); **dup**: stages whose streamed deltas, with the attempt numbers honoured, differ from the final
text, plus stages with two trace rows; **restarted**: stages streamed by two attempts (correct for a client
that honours `TextDelta.attempt`, doubled text for one that concatenates); **serves again**: seconds from the
fault until a new one-stage workflow started after it is answered; **residue**: accounting left in Redis
after the drain (load, inflight, queue, claims, requests still queued/running, program entries).
"""


def _codes(counts: Mapping[str, Any], kind: str) -> str:
    items = [f"{k.split(':', 1)[1]} {v}" for k, v in counts["codes"].items() if k.startswith(kind + ":")]
    return f" ({', '.join(items)})" if items else ""


def _residue(row: Mapping[str, Any]) -> str:
    left = row.get("residue") or {}
    if not left:
        return f"none ({row['drained_after_s']} s)" if row.get("drained_after_s") is not None else "none"
    return ", ".join(f"{k}={v}" for k, v in left.items())


def _row(name: str, row: Mapping[str, Any]) -> str:
    c = row["counts"]
    inj = row["injection"]
    injected = "yes" if inj["injectable"] else "**not injectable yet**"
    back = row.get("recovery_s")
    cells = [
        name,
        injected,
        inj["restarted_by"],
        str(c["started"]),
        str(c["completed"]),
        f"{c['failed_retryable']}{_codes(c, 'failed_retryable')}",
        f"{c['failed_other']}{_codes(c, 'failed_other')}",
        f"{c['lost']}{_codes(c, 'lost')}",
        f"{c['duplicated_stages']} / {c['traced_twice']}",
        str(c["restarted_stages"]),
        "-" if back is None else f"{back:g}",
        _residue(row),
        f"{c.get('stages_answered', 0)} ({c.get('whole_stages_answered', 0)})",
    ]
    return "| " + " | ".join(cells) + " |"


TABLE = (
    "| fault | injected | restarted by | started | completed | failed (retryable) | failed (other) | lost |"
    " dup (stream / traced twice) | restarted | serves again (s) | residue (drain) |"
    " stages answered (whole) |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def render(data: Mapping[str, Any]) -> str:
    out = [HEADER]
    kinds = data.get("kinds") or {}
    if kinds:
        m = data["meta"]
        out += [
            f"## One fault per stack\n\nCommit `{m['commit']}`, {m['date']}; {m['workflows']} workflows, "
            f"seed {m['seed']}, time_scale {m['time_scale']:g}, lease {m['lease_s']:g} s, {m['max_tokens']} "
            f"tokens per stage; {m['run_s']:.0f} s in all. `{m['command']}`\n",
            *(
                f"Rerun since, replacing its rows: {', '.join(r['kinds'])} at commit `{r['commit']}`, "
                f"{r['date']}, `{r['command']}`.\n"
                for r in data.get("reruns") or ()
            ),
            TABLE,
            *(_row(k, v) for k, v in kinds.items()),
            "",
            "Per fault: where and when it struck, notes, restarts and log errors.\n",
        ]
        for k, v in kinds.items():
            inj = v["injection"]
            out.append(
                f"- **{k}**: {inj['target'] or '-'} after {v['fault_after_s']} s "
                f"({v['stages_answered_before_fault']}/{v['stages_planned']} stages answered); "
                f"back after {inj['back_after_s']} s; {inj['note'] or 'no note'}; "
                f"restarts {v['restarts'] or '{}'}; "
                f"Redis data survived: {v['redis_data_survived']}; EndProgram failed for "
                f"{v['counts'].get('end_program_failed', 0)}; ERROR lines {v['log_errors'] or '{}'}; "
                f"run {v['run_s']} s."
            )
        out.append("")
    soak = data.get("soak")
    if soak:
        m = soak["meta"]
        out += [
            f"## Soak\n\nCommit `{m['commit']}`, {m['date']}; {soak['minutes']:g} min, {soak['concurrency']} "
            f"workflows in flight, {soak.get('dispatchers', 1)} dispatcher(s), {len(soak['faults'])} faults "
            f"({', '.join(soak['kinds'])}). `{m['command']}`\n",
            TABLE,
            _row("soak (all)", {**soak, "injection": {"injectable": True, "restarted_by": "-"}}),
            "",
            "| at (s) | fault | restarted by | back after (s) | serves again (s) | note |",
            "|---|---|---|---|---|---|",
        ]
        for f in soak["faults"]:
            inj = f["injection"]
            out.append(
                f"| {f['at_s']} | {inj['kind']} | {inj['restarted_by']} | {inj['back_after_s']} | "
                f"{f['recovery_s']} | {inj['note']} |"
            )
        out.append("")
    return "\n".join(out)


def write(out_dir: Path, section: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``payload`` under ``section`` ("kinds" rows keyed by kind, or "soak") into faults.json,
    keeping what other runs wrote, then rewrite faults.md from the whole."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "faults.json"
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if section == "kinds":
        old = data.get("kinds") or {}
        if set(payload["kinds"]) >= set(old):  # a full run: it describes every row
            data["meta"], data["reruns"] = payload["meta"], []
        else:  # a subset rerun: the full run's description stays, the rerun is listed beside it
            data["reruns"] = [
                *(data.get("reruns") or []),
                {**payload["meta"], "kinds": sorted(payload["kinds"])},
            ]
        data["kinds"] = {**old, **payload["kinds"]}
    else:
        data["soak"] = dict(payload)
    path.write_text(json.dumps(data, indent=1) + "\n")
    (out_dir / "faults.md").write_text(render(data))
    return data
