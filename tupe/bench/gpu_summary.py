"""The GPU suite's report: `summary.md` (and `summary.json`) rewritten after every stage, with a table per stage
(`steps_table`, `profile_table`, `long_table`) and the issue's targets read off the base/512 run (`targets`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .gpu_environment import bert_scheme, write_json
from .gpu_stages import DEFAULT_STAGES, STAGES
from .gpu_studies import packing_speed_lines, studies_lines


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def steps_table(bench: dict, peak: float | None) -> tuple[list[str], dict]:
    """Markdown rows of one `tupe bench` JSON, and the ratios the targets read."""
    rows = bench.get("steps", [])
    flash = next((r for r in rows if r["backend"] == "sdpa-flash"), None)
    hf = next((r for r in rows if r["scheme"] == "hf-bert"), None)
    measured = bench.get("matmul_peak_flops")
    lines = [
        "| model | kernel | step ms | tokens/s | x bert-a [sdpa-flash] | MFU (data sheet) | MFU (measured matmul) "
        "| peak memory GiB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ratios: dict = {}
    for r in rows:
        rel = r["tokens_per_s"] / flash["tokens_per_s"] if flash else None
        ratios[r["label"]] = rel
        flops_s = r["model_tflops_per_step"] * 1e12 / r["step_s_median"]
        lines.append(
            f"| {r['label']} | {r['kernel']} | {r['step_s_median'] * 1e3:.1f} | {r['tokens_per_s']:,.0f} | "
            f"{_fmt(rel)} | {_fmt(flops_s / peak * 100 if peak else None, '.1f')}% | "
            f"{_fmt(flops_s / measured * 100 if measured else None, '.1f')}% | "
            f"{_fmt(r['peak_memory_bytes'] / 2**30 if r.get('peak_memory_bytes') else None, '.2f')} |"
        )
    extra = {"flash": flash, "hf": hf}
    return lines, {"ratios": ratios, **extra}


def targets(bench: dict, peak: float | None) -> list[str]:
    """The issue's targets, read off the base/512 run: met or not, with the figure."""
    _, info = steps_table(bench, peak)
    flash, hf, ratios = info["flash"], info["hf"], info["ratios"]
    rows = bench.get("steps", [])
    out = []
    if flash:
        schemes = {
            r["label"]: ratios[r["label"]] for r in rows if r["scheme"] not in ("hf-bert", "hf-deberta")
        }
        schemes.pop(flash["label"], None)
        worst = min(schemes.items(), key=lambda kv: kv[1]) if schemes else None
        if worst:
            missed = [f"{k} {v:.3f}" for k, v in schemes.items() if v < 0.85]
            out.append(
                f"- every scheme >= 0.85 x bert-a [sdpa-flash]: **{'met' if not missed else 'not met'}** "
                f"(lowest {worst[0]} {worst[1]:.3f}"
                + (f"; below: {', '.join(missed)}" if missed else "")
                + ")"
            )
        tupe_a = next((v for k, v in schemes.items() if k.startswith("tupe-a [")), None)
        if tupe_a is not None:
            out.append(
                f"- tupe-a >= 0.95 x bert-a [sdpa-flash]: **{'met' if tupe_a >= 0.95 else 'not met'}** "
                f"({tupe_a:.3f})"
            )
    baseline = bert_scheme()
    bert = next((r for r in rows if r["scheme"] == baseline and r["backend"] != "sdpa-flash"), None)
    if bert and hf:
        rel = bert["tokens_per_s"] / hf["tokens_per_s"]
        out.append(
            f"- bert-a [default] >= 1.0 x hf-bert (SDPA): **{'met' if rel >= 1.0 else 'not met'}** "
            f"({rel:.3f}; bert-a [sdpa-flash] {flash['tokens_per_s'] / hf['tokens_per_s']:.3f})"
            if flash
            else f"- bert-a >= 1.0 x hf-bert: {rel:.3f}"
        )
    for r in (flash, bert):
        if r and peak:
            mfu = r["model_tflops_per_step"] * 1e12 / r["step_s_median"] / peak
            out.append(
                f"- MFU of {r['label']} >= 40% of the dense bf16 peak: **{'met' if mfu >= 0.4 else 'not met'}** "
                f"({100 * mfu:.1f}%)"
            )
    return out


def long_table(long: dict) -> list[str]:
    rows = [r for r in long.get("rows", [])]
    if not rows:
        return ["(no rows)"]
    lengths = sorted({r["seq_len"] for r in rows})
    by: dict = {}
    for r in rows:
        by.setdefault(r["scheme"], {})[r["seq_len"]] = r
    head = (
        "| scheme | kernel | "
        + " | ".join(f"{n} ms / GiB" for n in lengths)
        + " | memory growth per doubling |"
    )
    lines = [head, "| --- | --- | " + " | ".join("---:" for _ in lengths) + " | --- |"]
    for scheme, cells in by.items():
        kernel = next((c.get("kernel") for c in cells.values() if c.get("kernel")), "-")
        parts = []
        for n in lengths:
            c = cells.get(n)
            if c is None:
                parts.append("not run")
            elif "error" in c:
                parts.append(c["error"][:40])
            elif c.get("peak_bytes") is not None:
                parts.append(f"{c['step_s'] * 1e3:.0f} / {c['peak_bytes'] / 2**30:.2f}")
            else:
                parts.append(f"{c['step_s'] * 1e3:.1f} / -")
        growth = [
            cells[b]["step_peak_above_state_bytes"] / cells[a]["step_peak_above_state_bytes"]
            for a, b in zip(lengths, lengths[1:])
            if a in cells
            and b in cells
            and cells[a].get("step_peak_above_state_bytes")
            and cells[b].get("step_peak_above_state_bytes")
        ]
        g = ", ".join(f"{x:.2f}" for x in growth) if growth else "-"
        lines.append(f"| {scheme} | {kernel} | " + " | ".join(parts) + f" | {g} |")
    lines.append("")
    lines.append(
        "Growth: the step's memory above parameters + optimizer state, at 2n over n (2.0 = linear, 4.0 = "
        "quadratic)."
    )
    return lines


def profile_table(profile: dict) -> list[str]:
    rows = profile.get("rows", [])
    if not rows:
        return ["(no rows)"]
    lines = [
        f"One step at base, {profile.get('batch_size')} x {profile.get('seq_len')}, bf16 autocast, under PyTorch's "
        f"profiler (mean of {profile.get('steps')}):",
        "",
        "| model | kernel | wall ms | GPU busy ms | GPU busy share | kernels per step | top kernels (ms per step) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | - | {r['error'][:60]} | | | | |")
            continue
        busy = r.get("gpu_busy_ms")
        top = "; ".join(f"{k['name'][:40]} {k['ms_per_step']:.2f}" for k in r.get("top_kernels", [])[:3])
        lines.append(
            f"| {r['label']} | {r.get('kernel', '-')} | {r['wall_ms']:.1f} | {_fmt(busy, '.1f')} | "
            f"{_fmt(100 * (1 - r['gpu_idle_share']) if busy is not None else None, '.0f')}% | "
            f"{_fmt(r.get('kernel_launches_per_step'), '.0f')} | {top or '-'} |"
        )
    return lines


def portable(value: Any, names: dict[str, str]) -> Any:
    """`value` (a stage record: dicts, lists, strings) with each folder of `names` written as its name (`--out`'s
    folder -> `$OUT`, the checkout -> `.`), longest first: what comes back names no folder of the machine it ran on."""
    order = sorted((k for k in names if k), key=len, reverse=True)
    if isinstance(value, str):
        for folder in order:
            value = value.replace(folder, names[folder])
        return value
    if isinstance(value, dict):
        return {k: portable(v, names) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v, names) for v in value]
    return value


def write_summary(out: Path, env: dict, stages: dict, names: dict[str, str] | None = None) -> None:
    """`summary.md` and `summary.json` of the stages so far; `names`: folders written as names (`portable`)."""
    stages, peak = portable(stages, names or {}), env.get("dense_bf16_peak_flops")
    md = ["# GPU benchmark suite", ""]
    md.append(
        f"Device: {env.get('gpu') or env.get('device')} ({env.get('nvidia_smi') or '-'}); torch "
        f"{env.get('torch')} (CUDA {env.get('torch_cuda')}), triton {env.get('triton')}, transformers "
        f"{env.get('transformers')}, Python {env.get('python')}; commit {env.get('commit')}; started "
        f"{env.get('started_utc')}."
    )
    md.append(
        f"MFU denominator: {_fmt(peak / 1e12 if peak else None, '.1f')} TFLOP/s dense bf16 "
        f"({env.get('dense_bf16_peak_source')})."
    )
    md.append("")
    for name in [s for s in STAGES if s in stages or s in DEFAULT_STAGES]:
        st = stages.get(name)
        md.append(f"## {name}")
        md.append("")
        if st is None:
            md.append("not run")
        elif "skipped" in st:
            md.append(f"skipped: {st['skipped']}")
        elif name == "cuda-tests":
            c = st.get("counts")
            md.append(
                f"`{st.get('command')}`: "
                + (
                    f"**{c['passed']} passed, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped** "
                    f"in {c['time_s']:.0f} s"
                    if c
                    else f"no report (exit {st.get('returncode')})"
                )
                + (" (cut off by its time share)" if st.get("timed_out") else "")
            )
            for f in st.get("failed", [])[:20]:
                md.append(f"- failed: {f}")
        elif name == "steps":
            for sh in st.get("shapes", []):
                if "bench" not in sh:
                    md.append(
                        f"- {sh.get('seq_len')}: {sh.get('skipped') or 'failed (exit ' + str(sh.get('returncode')) + ')'}"
                    )
                    continue
                b = sh["bench"]
                md.append(
                    f"### base, {b['batch_size']} x {b['seq_len']}, bf16 autocast, median of the interleaved "
                    f"rounds (matmul peak measured {b['matmul_peak_flops'] / 1e12:.1f} TFLOP/s)"
                )
                md.append("")
                lines, _ = steps_table(b, peak)
                md += lines
                md.append("")
                if b["seq_len"] >= 512 or len(st["shapes"]) == 1:
                    md.append("Targets (base/512):")
                    md += targets(b, peak)
                    md.append("")
        elif name == "profile":
            md += profile_table(st)
        elif name == "long":
            md += long_table(st)
        elif "error" in st:
            md.append(f"error: {st['error']}")
        elif name == "packing-speed":
            md += packing_speed_lines(st)
        elif name == "studies":
            md += studies_lines(st, out)
        elif name == "end-to-end":
            fig = st.get("figures")
            if fig:
                md.append(
                    f"`{st.get('command')}`: **{fig['tokens_per_s']:,.0f} tokens/s** over {fig['timed_steps']} "
                    f"steps including evaluation and checkpoints (steady {fig['steady_tokens_per_s']:,.0f}); "
                    f"first step {fig['time_to_first_step_s']:.1f} s after launch."
                )
            if st.get("error"):
                md.append(f"error: {st['error']}")
        md.append("")
    (out / "summary.md").write_text("\n".join(md))
    write_json(out / "summary.json", {"environment": env, "stages": stages})
