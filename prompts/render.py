"""Fill the prompt templates (prompts/templates/*.txt, ``string.Template`` placeholders).

What the model is shown: the hardware; the task's public spec (reference code, public shapes,
dtype, tolerance, roofline floor per public shape); torch.compile's own code for the reference
(given as data: the loop captures it) with its measured times; the parent kernel with its measured feedback
or its failure; inspirations from the archive; distilled lessons. Never the hidden shapes: the
task section is built from public shapes only, verdict text is redacted (feedback.Redactor), and
a final check refuses to return a prompt that still names a hidden shape.

``hardware`` keys read (all optional): gpu, arch, sms, memory_gib, l2_bytes, torch, triton, cuda
(as from ``verifier.environment.describe``), and the measured ceilings ``bandwidth_gbps`` (device
copy, GB/s) and ``tflops`` (dense bf16 matmul, TFLOP/s). Without measured ceilings the H200's
nominal figures are used and labelled as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any, Mapping, Sequence

from kernforge.tasks import report, runtime
from kernforge.tasks.report import NOMINAL_BANDWIDTH, NOMINAL_FLOPS
from kernforge.tasks.spec import Task
from kernforge.verifier import defences
from kernforge.verifier.checks import Check
from kernforge.verifier.verdict import THREATS, Accepted, Rejected, Status, Verdict

from .feedback import FAILED_HIDDEN, WITHHELD, Redactor, candidate_text_withheld, clip, evidence_text, excerpt, hidden_line, public_table

TEMPLATES = Path(__file__).resolve().parent / "templates"


class PromptLeak(RuntimeError):
    """A rendered prompt still names a hidden shape; it is never sent."""


@dataclass(frozen=True)
class Parent:
    """The kernel to improve or repair, with its verdict if it has one."""

    code: str
    verdict: Verdict | None = None
    summary: str = ""


@dataclass(frozen=True)
class Inspiration:
    code: str
    summary: str = ""
    verdict: Verdict | None = None


@dataclass(frozen=True)
class TorchCompile:
    """torch.compile's own code for the task's reference, shown as the code to beat: TorchInductor's
    Triton kernels and the ``call`` that launches them (``code``, already without Inductor's imports,
    decorators and harness when ``source_lines`` says the file was longer), and the judge's
    torch.compile time per public shape label where the archive has measured one."""

    code: str
    #: lines of Inductor's whole output file, when ``code`` is a part of it
    source_lines: int | None = None
    times_us: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Limits:
    """Character budgets. A prompt over ``total_chars`` loses inspirations, then lessons, then code."""

    total_chars: int = 60_000
    reference_chars: int = 12_000
    parent_code_chars: int = 20_000
    inspiration_code_chars: int = 6_000
    torch_compile_chars: int = 8_000
    max_inspirations: int = 3
    max_lessons: int = 10
    lesson_chars: int = 300
    reason_chars: int = 1_500
    value_chars: int = 400
    log_chars: int = 3_000


@dataclass(frozen=True)
class Prompt:
    system: str
    user: str
    #: what was left out to stay within Limits.total_chars
    dropped: tuple[str, ...] = ()

    @property
    def chars(self) -> int:
        return len(self.system) + len(self.user)

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


@lru_cache(maxsize=None)
def template(name: str) -> Template:
    return Template((TEMPLATES / f"{name}.txt").read_text())


def fill(template_name: str, /, **values: Any) -> str:
    """A template with every placeholder filled (a missing one is a KeyError, not a silent gap)."""
    return template(template_name).substitute({k: str(v) for k, v in values.items()}).strip()


# ---- sections ----------------------------------------------------------------------------------


def _ceilings(hardware: Mapping[str, Any]) -> tuple[float, float, str]:
    bw = hardware.get("bandwidth_gbps")
    flops = hardware.get("tflops")
    if bw and flops:
        return float(bw) * 1e9, float(flops) * 1e12, "measured on this GPU"
    return NOMINAL_BANDWIDTH, NOMINAL_FLOPS, "nominal H200 figures, not measured here"


def hardware_section(hardware: Mapping[str, Any], device_kind: str) -> str:
    def get(key: str) -> Any:
        return hardware.get(key) or "unknown"

    if device_kind == "cpu":
        return fill("hardware_cpu", torch=get("torch"), triton=get("triton"))
    bw, flops, source = _ceilings(hardware)
    l2 = hardware.get("l2_bytes")
    memory = hardware.get("memory_gib")
    return fill(
        "hardware_gpu",
        gpu=get("gpu"), arch=get("arch"), sms=get("sms"),
        memory=f"{memory} GiB" if memory else "unknown",
        l2=f"{l2 / 2**20:.0f} MiB" if l2 else "unknown",
        ceiling_source=source, bandwidth=f"{bw / 1e9:.0f} GB/s", flops=f"{flops / 1e12:.0f} TFLOP/s",
        torch=get("torch"), triton=get("triton"), cuda=get("cuda"),
    )


def floors_us(task: Task, hardware: Mapping[str, Any], device_kind: str) -> dict[str, float]:
    """Roofline floor per public shape label, in microseconds (none on the interpreter)."""
    if device_kind == "cpu":
        return {}
    bw, flops, _ = _ceilings(hardware)
    out = {}
    for shape in task.shapes(device_kind, hidden=False):
        line = runtime.roofline(task, shape, task.dtype(device_kind))
        if line is not None:
            out[shape.label] = line.floor_seconds(bw, flops) * 1e6
    return out


def task_section(task: Task, hardware: Mapping[str, Any], device_kind: str, limits: Limits) -> str:
    spec = task.public_spec()
    dtype = task.dtype(device_kind)
    floors = floors_us(task, hardware, device_kind)
    rows = ["| shape | MB moved | GFLOP | roofline floor us |", "|---|---|---|---|"]
    for shape in task.shapes(device_kind, hidden=False):
        line = runtime.roofline(task, shape, dtype)
        mb = f"{line.bytes / 1e6:.3f}" if line else "-"
        gflop = f"{line.flops / 1e9:.3f}" if line else "-"
        floor = f"{floors[shape.label]:.3g}" if shape.label in floors else "-"
        rows.append(f"| {shape.label} | {mb} | {gflop} | {floor} |")
    mutated = spec["mutated_inputs"]
    return fill(
        "task",
        name=spec["name"],
        description=spec["description"],
        reference=clip(spec["reference"].rstrip(), limits.reference_chars, keep="head"),
        dtype=dtype,
        shapes="\n".join(rows),
        tolerances="\n".join(f"- {line}" for line in report.tolerance_lines(task, device_kind)),
        torch_ops="allowed" if spec["allow_torch_ops"] else "forbidden (only your own kernels compute)",
        in_place=(f"In place: the op writes inputs {mutated}; they are compared like outputs" if mutated
                  else "Inputs are read-only: writing into one is rejected"),
        distributions=", ".join(task.distributions),
    )


def torch_compile_section(compiled: TorchCompile | None, task: Task, device_kind: str, limits: Limits) -> str:
    """torch.compile's code for the reference and its measured times (public shapes only); empty
    without code: a reference Inductor writes no Triton for says nothing here."""
    if compiled is None or not compiled.code.strip():
        return ""
    code = compiled.code.strip()
    trimmed = []
    if compiled.source_lines and compiled.source_lines > code.count("\n") + 1:
        trimmed.append(f"Trimmed from Inductor's {compiled.source_lines}-line output file to its kernels and `call`: "
                       "its imports, autotuning decorators and benchmark harness are left out.")
    if len(code) > limits.torch_compile_chars:
        trimmed.append(f"The listing is cut after {limits.torch_compile_chars} characters.")
    public = {shape.label for shape in task.shapes(device_kind, hidden=False)}
    times = [(label, us) for label, us in compiled.times_us if label in public and us]
    table = ""
    if times:
        rows = "\n".join(f"| {label} | {us:.4g} |" for label, us in times)
        table = ("\ntorch.compile's time per public shape, as the judge measured it beside accepted kernels:\n"
                 f"| shape | torch.compile us |\n|---|---|\n{rows}\n")
    return fill("torch_compile", code=clip(code, limits.torch_compile_chars, keep="head"),
                trimmed=" ".join(trimmed), times=table)


_DOCSTRING = re.compile(r"""\A\s*(?:#[^\n]*\n\s*)*[rRuU]?(\"\"\"|\'\'\'|"|')(.*?)\1""", re.DOTALL)


def _summary(code: str, given: str) -> str:
    """The given summary, else the first line of the module docstring (no parse: code may be huge)."""
    if given:
        return given
    match = _DOCSTRING.match(code[:4000])
    lines = match.group(2).strip().splitlines() if match else []
    return lines[0].strip() if lines else ""


def parent_section(parent: Parent, floors: Mapping[str, float], redactor: Redactor, limits: Limits,
                   code_chars: int) -> str:
    code = clip(parent.code.rstrip(), code_chars, keep="head")
    summary = redactor.scrub(_summary(parent.code, parent.summary))
    verdict = parent.verdict
    if verdict is None:
        return fill("parent_unmeasured", summary=summary, code=code)
    table = public_table(verdict.shapes, floors)
    if isinstance(verdict, Accepted):
        return fill(
            "parent_accepted", summary=summary, code=code,
            table=table or "(no public-shape measurements recorded)",
            hidden=hidden_line(verdict),
            # the judge's own words, raised before any hidden shape (Accepted.hidden_flags has the rest)
            flags=("Flags: " + "; ".join(redactor.scrub(f) for f in verdict.flags)) if verdict.flags else "",
        )
    if candidate_text_withheld(verdict):
        # one outcome, whatever its status, check or text (feedback.candidate_text_withheld); its
        # public times were taken before it saw a hidden shape (verifier/judge.py)
        return fill(
            "parent_rejected", summary=summary, code=code, status=FAILED_HIDDEN, reason=WITHHELD, threat="",
            check="", evidence="", table=("Measured on public shapes before it failed:\n" + table) if table else "",
            hidden=hidden_line(verdict),
        )
    if verdict.threat:
        kind = "Caught" if verdict.status is Status.CHEAT else "Signature of"
        threat_line = f"{kind}: THREATS #{verdict.threat} ({THREATS.get(verdict.threat, 'unknown')})."
    else:
        threat_line = ""
    evidence = evidence_text(verdict.evidence, redactor, value_chars=limits.value_chars, log_chars=limits.log_chars)
    return fill(
        "parent_rejected", summary=summary, code=code,
        status=verdict.status.value,
        reason=excerpt(verdict.reason, redactor, limits.reason_chars),
        threat=threat_line,
        check=check_line(verdict),
        evidence=("Evidence:\n" + evidence) if evidence else "",
        table=("Measured on public shapes before it failed:\n" + table) if table else "",
        hidden=hidden_line(verdict),
    )


def check_line(verdict: Rejected) -> str:
    """Which check rejected it and what passes that check (the defence's own remedy)."""
    if verdict.check is Check.OTHER:  # an older archive's check string: nothing known to say
        return ""
    remedy = defences.remedy(verdict.check)
    return f"Check: {verdict.check.value}." + (f" What passes it: {remedy}" if remedy else "")


def _measured(verdict: Verdict | None, redactor: Redactor) -> str:
    """One line on how an inspiration did (public shapes only)."""
    if verdict is None:
        return "(not measured)"
    if candidate_text_withheld(verdict):
        return f"{FAILED_HIDDEN}: {WITHHELD}"
    if not verdict.accepted:
        return f"rejected ({verdict.status.value}): " + excerpt(verdict.reason, redactor, 200, keep="head")
    public = [s for s in verdict.shapes if not s.hidden]
    parts = []
    for key, name in (("speedup_compile", "vs torch.compile"), ("speedup_eager", "vs eager"), ("pct_bandwidth", "copy bandwidth")):
        values = [getattr(s, key) for s in public if getattr(s, key) is not None]
        if values:
            unit = "%" if key == "pct_bandwidth" else "x"
            span = f"{min(values):.3g}{unit}" + (f"-{max(values):.3g}{unit}" if max(values) != min(values) else "")
            parts.append(f"{name} {span}")
    return "accepted" + (": " + ", ".join(parts) + " over the public shapes" if parts else "")


def inspirations_section(items: Sequence[Inspiration], redactor: Redactor, limits: Limits) -> str:
    if not items:
        return ""
    blocks = [
        fill("inspiration", index=i, summary=redactor.scrub(_summary(item.code, item.summary)) or "(no summary)",
             measured=_measured(item.verdict, redactor),
             code=clip(item.code.rstrip(), limits.inspiration_code_chars, keep="head"))
        for i, item in enumerate(items, 1)
    ]
    return fill("inspirations", items="\n\n".join(blocks))


def lessons_section(lessons: Sequence[str], redactor: Redactor, limits: Limits) -> str:
    # One line each: whitespace runs collapse so a multi-line lesson cannot break the list.
    kept = [excerpt(" ".join(str(text).split()), redactor, limits.lesson_chars, keep="head")
            for text in lessons if str(text).strip()]
    if not kept:
        return ""
    return fill("lessons", items="\n".join(f"- {text}" for text in kept))


def instructions(parent: Parent | None) -> str:
    if parent is None:
        return fill("instructions_new")
    if parent.verdict is None:
        return fill("instructions_start")
    if parent.verdict.accepted:
        return fill("instructions_improve")
    if parent.verdict.status is Status.CHEAT and not candidate_text_withheld(parent.verdict):
        threat = parent.verdict.threat
        return fill("instructions_cheat", threat_name=f"THREATS #{threat} {THREATS.get(threat, '')}".strip())
    return fill("instructions_repair")


# ---- the prompt ---------------------------------------------------------------------------------


def render(
    task: Task,
    hardware: Mapping[str, Any],
    *,
    parent: Parent | None = None,
    inspirations: Sequence[Inspiration] = (),
    lessons: Sequence[str] = (),
    device_kind: str = "cuda",
    limits: Limits = Limits(),
    torch_compile: TorchCompile | None = None,
) -> Prompt:
    """The system and user messages for one proposal. ``torch_compile``: torch.compile's own code
    for the reference (the loop captures it), shown as the code to beat."""
    redactor = Redactor(task)
    system = fill("system")
    fixed = {
        "hardware": hardware_section(hardware, device_kind),
        "task": task_section(task, hardware, device_kind, limits),
        "instructions": instructions(parent),
    }
    floors = floors_us(task, hardware, device_kind)
    kept_inspirations = list(inspirations[: limits.max_inspirations])
    kept_lessons = list(lessons[-limits.max_lessons:])  # the newest lessons are the most relevant
    code_chars = limits.parent_code_chars
    dropped: list[str] = [f"inspiration {i + 1}" for i in range(limits.max_inspirations, len(inspirations))]
    dropped += [f"{len(lessons) - len(kept_lessons)} older lesson(s)"] if len(lessons) > len(kept_lessons) else []
    parent_text = parent_section(parent, floors, redactor, limits, code_chars) if parent else ""
    compiled_text = torch_compile_section(torch_compile, task, device_kind, limits)
    while True:
        user = fill(
            "user",
            torch_compile=compiled_text,
            parent=parent_text,
            inspirations=inspirations_section(kept_inspirations, redactor, limits),
            lessons=lessons_section(kept_lessons, redactor, limits),
            **fixed,
        )
        # Empty sections leave runs of blank lines; code keeps its own (at most two blank lines).
        user = re.sub(r"\n{4,}", "\n\n", user)
        if len(system) + len(user) <= limits.total_chars:
            break
        if kept_inspirations:
            dropped.append(f"inspiration {len(kept_inspirations)}")
            kept_inspirations.pop()
        elif kept_lessons:
            dropped.append("lessons")
            kept_lessons = []
        elif compiled_text:
            dropped.append("torch.compile's code")
            compiled_text = ""
        elif parent is not None and code_chars > 2_000:
            code_chars //= 2
            dropped.append(f"parent code beyond {code_chars} characters")
            parent_text = parent_section(parent, floors, redactor, limits, code_chars)
        else:
            user = clip(user, max(limits.total_chars - len(system), 1_000), keep="both")
            dropped.append("the middle of the prompt")
            break
    _refuse_leaks(task, user)
    return Prompt(system=system, user=user, dropped=tuple(dropped))


def _refuse_leaks(task: Task, text: str) -> None:
    """Last line of defence: a hidden shape's full label never leaves in a prompt.

    Python blocks are skipped: they hold the public reference and model-written code, neither of
    which can know a hidden shape, and a one-parameter shape (``N = 1000``) could match them by chance.
    """
    text = re.sub(r"```python\n.*?```", "", text, flags=re.DOTALL)
    for shape in (*task.hidden_shapes, *task.cpu_hidden_shapes):
        pairs = [rf"['\"]?{re.escape(k)}['\"]?\s*[=:]\s*{v}(?![\w.])" for k, v in shape.params]
        if pairs and re.search(r"[\s,;]*".join(pairs), text):
            raise PromptLeak(f"the prompt for {task.name} names a hidden shape; it was not sent")
