"""Where candidates come from: the LLM proposer, the offline tuner, and which one a run gets.

Both are a ``Proposer``: they answer ``await propose(task, population, lessons)`` with a
``Proposal`` (a module to judge, with what it cost) or a ``NoProposal`` (nothing left to try for
this task, and why), hear every verdict through ``observe``, prepare in the background what the
tasks will need (``prepare``), learn what the archive judged before (``prime``) and say how far
their proposals can reach (``reach``). The runner does not know which one it drives.

* ``LLMProposer``: a bandit arm (strategy, model) is pulled (strategy.py), the population gives the
  parent and inspirations for that strategy (search.py), the prompt is rendered from the templates
  (prompts/), and one chat completion is asked of that model (llm.py). With no seed kernel and
  nothing archived, the only strategy is ``fresh``: the model starts from the reference alone.
  Every prompt of a task also shows torch.compile's own code for its reference, as the code to
  beat: captured once per task per run (``inductor_start.output_code_async``, a child process
  that runs Inductor's code generation for seconds, on a public shape), in the background from the start of the run
  (``prepare``), a few at a time; a prompt waits only for its own task's capture. A reference
  Inductor writes no Triton for (or a capture that fails) just has no such section.
* ``OfflineTuner``: ``offline.OfflineProposer`` per task, asked around the best kernel, then the
  other niches' elites, then the unjudged seed. A task with no seed and nothing accepted first gets
  the Inductor start (``inductor_start``: torch.compile's own Triton kernels as a ``ModelNew``),
  once; where Inductor gives none, or it was rejected, a ``NoProposal`` says so plainly. Which
  tasks that is, ``needs_start`` says, for ``propose`` and ``prepare`` alike: the runner hands
  every task to ``prepare`` in the order it will first pick them, and the starts are derived in the
  background from the start of the run (a child process each, compiling for seconds), a few ahead
  of the producer taking them (each child is stopped while a verdict times: ``Devices.gpu_child``;
  and each takes cores and GPU memory); a task's first proposal waits only for its own derivation, and the GPU is not left idle
  while each task's is made in turn. A derivation that cannot run is a ``NoStart`` saying why.
  ``reach`` counts the configurations its starting kernels can give, so a run can say up front
  that an attempt budget is out of reach.

``llm_config`` decides: the LLM proposer when a key is configured or an endpoint is named that
needs none (``--base-url``, the "local" preset), else the offline tuner; asking for a provider or
model without a key is an error, never a silent fall back.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from kernforge.prompts.render import Inspiration, Parent, PromptLeak, TorchCompile, render
from kernforge.tasks.spec import Task
from kernforge.verifier.judge_errors import out_of_memory
from kernforge.verifier.verdict import Verdict

from .config import ConfigError, LLMConfig, load_config, needs_key
from .errors import LoopError
from .inductor_start import GpuHold, Listing, NoStart, Start, derive_async, listing, output_code_async
from .lessons import Lessons
from .llm import LLMClient
from .offline import NoProposal, OfflineProposer, Reach
from .search import Member, Population
from .strategy import Arm, Bandit, proposer_name

#: Inductor captures (or derivations of a start) running at once, per proposer: each a child
#: process that compiles a reference for seconds, mostly on the CPU
CAPTURE_SLOTS = 2
#: Inductor starts derived ahead of the offline tuner's producer asking for them (prepare)
PREPARED_AHEAD = CAPTURE_SLOTS
#: a capture that ran out of GPU memory is tried this many times in all, this many seconds apart
START_MEMORY_TRIES = 3
START_MEMORY_WAIT_S = 20.0


@dataclass(frozen=True)
class Proposal:
    """A candidate to judge (``code``) and everything the archive keeps about how it came."""

    code: str
    proposer: str  # "seed", "offline" or "llm/<strategy>"
    model: str = ""
    parent: Member | None = None
    arm: Arm | None = None
    prompt: str = ""
    response: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    #: False when the model has no price in the table (cost counted as 0)
    cost_known: bool = True
    latency_s: float = 0.0
    retries: int = 0
    description: str = ""
    #: None: a module to judge. Otherwise the extraction kind (truncated, no_code, no_model_new):
    #: the reply held no module, and ``note`` says why
    unusable: str | None = None
    note: str = ""


def llm_config(*, provider: str | None, base_url: str | None, models: Sequence[str], offline: bool,
               env: Mapping[str, str] | None = None) -> LLMConfig | None:
    """The LLM configuration of a run, or None for the offline tuner (see the module docstring)."""
    env = os.environ if env is None else env
    if offline:
        if provider or base_url or models:
            raise LoopError("--offline runs the offline tuner: it takes no --provider, --base-url or --model")
        return None
    config = load_config(provider=provider, base_url=base_url, model=models[0] if models else None, env=env)
    if config.api_key is None and needs_key(config):
        if provider or models or env.get("KERNFORGE_PROVIDER") or env.get("KERNFORGE_MODEL"):
            raise ConfigError(
                f"no API key for {config.provider}: set KERNFORGE_API_KEY (or the provider's usual variable, "
                f"e.g. MINIMAX_API_KEY), or [keys] {config.provider} in the config file; without a key, "
                "leave out --provider/--model to run the offline tuner"
            )
        return None
    return config


#: a task's archived attempts for this environment, as (code, verdict), read when asked for
History = Callable[[], Iterable[tuple[str, Verdict | None]]]


class Proposer(Protocol):
    """What the runner drives: the LLM proposer or the offline tuner."""

    #: "llm" or "offline"
    kind: str

    @property
    def concurrency(self) -> int:
        """Proposals asked for at once (the run's producers)."""
        ...

    def describe(self) -> str: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None:
        """Stop what runs in the background (its child processes are killed)."""
        ...

    def prepare(self, tasks: Iterable[tuple[Task, Population]]) -> None:
        """The open tasks, with their populations, in the order the run will first pick them: what
        their proposals will need is made in the background from now."""
        ...

    def prime(self, task: Task, history: History) -> None:
        """What the archive judged for ``task`` before this session (read only if it is used)."""
        ...

    def reach(self, task: Task, population: Population) -> Reach | None:
        """How many proposals ``task`` can have at most, where that is known (None: no bound)."""
        ...

    async def propose(self, task: Task, population: Population, lessons: Lessons) -> Proposal | NoProposal: ...

    def observe(self, task: Task, code: str, verdict: Verdict) -> None: ...


class LLMProposer:
    kind = "llm"

    def __init__(self, config: LLMConfig, models: Sequence[str], bandit: Bandit, *, hardware: Mapping[str, Any],
                 device_kind: str, note: Callable[[str], None] | None = None, gpu_hold: GpuHold | None = None) -> None:
        self.config = config
        #: held around each torch.compile capture on a GPU (inductor_start.derive_async)
        self.gpu_hold = gpu_hold
        #: says why a task's prompts show no torch.compile code (the run's display)
        self.note = note or (lambda text: None)
        #: per task name: its torch.compile listing, being captured or captured (None: nothing to show)
        self._compiled: dict[str, asyncio.Task[Listing | None]] = {}
        self._capture_slots = asyncio.Semaphore(CAPTURE_SLOTS)
        self.bandit = bandit
        self.hardware = dict(hardware)
        self.device_kind = device_kind
        names = list(dict.fromkeys(models)) or [config.model]
        self.clients = {m: LLMClient(replace(config, model=m)) for m in names}
        self.models: list[str] = []

    async def start(self) -> None:
        """Resolve each model's name (a local server without --model names the one it serves)."""
        self.models = [await client.resolve_model() for client in self.clients.values()]
        self.clients = dict(zip(self.models, self.clients.values()))

    async def aclose(self) -> None:
        for capture in self._compiled.values():
            capture.cancel()  # kills its child process
        await asyncio.gather(*self._compiled.values(), return_exceptions=True)
        for client in self.clients.values():
            await client.aclose()

    @property
    def concurrency(self) -> int:
        return self.config.concurrency

    def prepare(self, tasks: Iterable[tuple[Task, Population]]) -> None:
        """Start capturing torch.compile's code for ``tasks``, in their order, in the background."""
        for task, _ in tasks:
            self._capture(task)

    def prime(self, task: Task, history: History) -> None:
        """The LLM proposer reads the archive through the population, lessons and bandit."""

    def reach(self, task: Task, population: Population) -> Reach | None:
        return None  # a model's proposals have no count

    def _capture(self, task: Task) -> asyncio.Task[Listing | None]:
        if task.name not in self._compiled:
            self._compiled[task.name] = asyncio.create_task(self._listing(task), name=f"inductor {task.name}")
        return self._compiled[task.name]

    async def _listing(self, task: Task) -> Listing | None:
        async with self._capture_slots:
            try:
                code = await output_code_async(task, self.device_kind, hold=self.gpu_hold)
                shown = listing(code) if isinstance(code, str) else None
            except (OSError, ValueError, SyntaxError) as error:  # the child could not start, or odd output
                code = NoStart(f"{type(error).__name__}: {error}")
                shown = None
        if isinstance(code, NoStart):
            self.note(f"[{task.name}] prompts show no torch.compile code: {code.reason}")
        elif shown is None:
            self.note(f"[{task.name}] prompts show no torch.compile code: Inductor writes no Triton kernel for it")
        return shown

    async def torch_compile(self, task: Task, population: Population) -> TorchCompile | None:
        """torch.compile's code for ``task`` (captured once per run) and its measured times."""
        # shielded: a producer cancelled while it waits must not cancel the capture another waits on
        shown = await asyncio.shield(self._capture(task))
        if shown is None:
            return None
        return TorchCompile(shown.text, shown.total_lines, population.compile_times())

    def describe(self) -> str:
        return f"LLM {', '.join(self.models or list(self.clients))} at {self.config.base_url}"

    async def propose(self, task: Task, population: Population, lessons: Lessons) -> Proposal:
        available = [(s, m) for s in population.strategies() for m in self.models]
        strategy, model = self.bandit.choose(available)
        choice = population.choose(strategy)
        parent = Parent(choice.parent.code, choice.parent.verdict, choice.parent.summary) if choice.parent else None
        inspirations = [Inspiration(m.code, m.summary, m.verdict) for m in choice.inspirations]
        compiled = await self.torch_compile(task, population)
        prompt, parent_shown = self._render(task, parent, inspirations, lessons.current(), compiled)
        completion = await self.clients[model].propose(prompt.messages())
        response = completion.text
        if completion.reasoning:
            response = f"<think>\n{completion.reasoning}\n</think>\n\n{completion.text}"
        unusable = None if completion.code is not None else completion.code_kind
        return Proposal(
            # A reply without a module is archived with its answer as the "code": the attempt
            # still happened, and its text is what a person (or a lesson) needs to see.
            code=completion.code if completion.code is not None else (completion.text or "(empty reply)"),
            proposer=proposer_name(choice.strategy), model=completion.model,
            parent=choice.parent if parent_shown else None,
            arm=(choice.strategy, model), prompt=json.dumps(prompt.messages()), response=response,
            tokens_in=completion.tokens_in, tokens_out=completion.tokens_out, cost=completion.cost or 0.0,
            cost_known=completion.cost is not None, latency_s=completion.latency_s, retries=completion.retries,
            description=completion.summary or completion.note, unusable=unusable, note=completion.note,
        )

    def _render(self, task: Task, parent: Parent | None, inspirations: list[Inspiration], lessons: list[str],
                compiled: TorchCompile | None):
        """The prompt, and whether it shows ``parent``. Lessons and inspirations quote verifier
        text; without them the prompt is the task, the parent (redacted) and the hardware; a parent
        that still names a hidden shape is left out (a fresh kernel is asked for instead: one
        kernel's record never stops the run). If the task's own prompt leaks, nothing is sent."""
        attempts = [(parent, inspirations, lessons), (parent, [], [])] + ([(None, [], [])] if parent is not None else [])
        for shown, shown_inspirations, shown_lessons in attempts:
            try:
                return render(task, self.hardware, parent=shown, inspirations=shown_inspirations, lessons=shown_lessons,
                              device_kind=self.device_kind, torch_compile=compiled), shown is parent
            except PromptLeak as leak:
                last = leak
        raise LoopError(str(last)) from None

    def observe(self, task: Task, code: str, verdict: Verdict) -> None:
        """The LLM proposer learns through the population, lessons and bandit, not here."""


class OfflineTuner:
    kind = "offline"

    def __init__(self, seed: int = 0, device_kind: str = "cpu", *, clusters: bool = False,
                 gpu_hold: GpuHold | None = None) -> None:
        self.seed = seed
        self.device_kind = device_kind
        #: held around each Inductor capture on a GPU (inductor_start.derive_async)
        self.gpu_hold = gpu_hold
        #: the GPU launches thread-block clusters (knobs.clusters_in): num_ctas is a knob
        self.clusters = clusters
        self._tuners: dict[str, OfflineProposer] = {}
        #: per task: the Inductor start's code and its verdict once judged, or why there is none
        self._starts: dict[str, tuple[str, Verdict | None] | str] = {}
        #: per task name: its Inductor start, being derived or derived (``prepare``, or on demand)
        self._derivations: dict[str, asyncio.Task[Start | NoStart]] = {}
        self._queued: collections.deque[Task] = collections.deque()  # prepared, not yet derived
        self._derive_slots = asyncio.Semaphore(CAPTURE_SLOTS)

    #: one proposal at a time: each is made from every verdict before it
    concurrency = 1

    def describe(self) -> str:
        return "offline tuner (no LLM: block sizes, warps, stages and cache hints of existing Triton kernels)"

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        """Cancel the Inductor starts still being derived (each one's child process is killed:
        ``inductor_start._child_reply``) and wait for them, so a stopped run leaves none behind."""
        self._queued.clear()
        for derivation in self._derivations.values():
            derivation.cancel()
        await asyncio.gather(*self._derivations.values(), return_exceptions=True)

    def prepare(self, tasks: Iterable[tuple[Task, Population]]) -> None:
        """The Inductor starts of those of ``tasks`` that ``needs_start``, derived ahead."""
        self.derive_ahead(task for task, population in tasks if self.needs_start(task, population))

    def derive_ahead(self, tasks: Iterable[Task]) -> None:
        """Derive the Inductor start of each of ``tasks``, in their order, in the background: the runner's producer then finds a task's start derived, or waits
        for that one alone, instead of deriving every task's in turn. Only ``PREPARED_AHEAD`` are
        derived ahead of the producer taking them (``_feed``): each derivation compiles for
        seconds in a child process, on the CPU cores and the GPU the verdicts use (stopped while
        one times: ``Devices.gpu_child``), so 43 KernelBench starts derived at once would slow
        every verdict of the run's first minutes for starts that are not needed yet. Before
        session 37 each child held the GPU's gate shared from start to end, and every timed phase
        waited for it."""
        self._queued.extend(tasks)
        self._feed()

    def _feed(self) -> None:
        """Start the next queued derivations while fewer than ``PREPARED_AHEAD`` are untaken."""
        while self._queued and sum(name not in self._starts for name in self._derivations) < PREPARED_AHEAD:
            self._derivation(self._queued.popleft())

    def needs_start(self, task: Task, population: Population) -> bool:
        """True when ``propose`` would give ``task`` the Inductor start: nothing to tune
        (``population.tunable()``) and no seed that says why (rejected, or one the CPU cannot run).
        ``prepare`` asks it too, to know which tasks' starts to derive ahead."""
        return not population.tunable() and self._unusable_seed(task, population) is None

    def _derivation(self, task: Task) -> asyncio.Task[Start | NoStart]:
        if task.name not in self._derivations:
            self._derivations[task.name] = asyncio.create_task(self._derive(task), name=f"inductor start {task.name}")
        return self._derivations[task.name]

    async def _derive(self, task: Task) -> Start | NoStart:
        """``task``'s Inductor start (or why there is none) once a slot is free. A capture that ran
        out of GPU memory is tried again a little later, up to ``START_MEMORY_TRIES`` times: it runs
        beside the verdicts, and a verdict's arena may hold most of the GPU for the moment (on an
        H100 KernelBench's Tanh, 3.4 GiB a call, found the GPU full, and the problem went without
        any start for the whole run)."""
        tries = 0
        while True:
            tries += 1
            async with self._derive_slots:
                result = await derive_async(task, self.device_kind, hold=self.gpu_hold)
            if not isinstance(result, NoStart) or not out_of_memory(RuntimeError(result.reason)):
                return result
            if tries == START_MEMORY_TRIES:
                return NoStart(f"{result.reason.rstrip('.')} ({tries} tries, {START_MEMORY_WAIT_S:.0f} s apart)")
            await asyncio.sleep(START_MEMORY_WAIT_S)

    def _tuner(self, task: Task) -> OfflineProposer:
        if task.name not in self._tuners:
            self._tuners[task.name] = OfflineProposer(seed=self.seed, clusters=self.clusters)
        return self._tuners[task.name]

    def reach(self, task: Task, population: Population) -> Reach | None:
        """How many configurations the kernels this tuner would start from (``population.tunable()``)
        can give, summed over their families, and how many were tried; None when none has knobs.
        On a GPU it is an upper bound: measured times move the search and widen block sizes."""
        tuner = self._tuner(task)
        reaches: dict[str, Reach] = {}
        for parent in population.tunable():
            reach = tuner.reach(parent.code, widening=self.device_kind != "cpu")
            if reach is not None:
                reaches.setdefault(reach.family, reach)
        if not reaches:
            return None
        first = next(iter(reaches.values()))
        return Reach(",".join(reaches), first.labels, sum(r.total for r in reaches.values()),
                     sum(r.tried for r in reaches.values()), len(reaches))

    def prime(self, task: Task, history: History) -> None:
        """Configurations already tried for ``task`` (archived attempts): never proposed again."""
        tuner = self._tuner(task)
        for code, verdict in history():
            tuner.record(code, verdict)

    def observe(self, task: Task, code: str, verdict: Verdict) -> None:
        self._tuner(task).record(code, verdict)
        start = self._starts.get(task.name)
        if isinstance(start, tuple) and start[0] == code:
            self._starts[task.name] = (code, verdict)

    async def _inductor_start(self, task: Task) -> Proposal | NoProposal:
        """The Inductor start, the first time (derived in the background since ``prepare``, or now);
        afterwards why there is nothing to start from."""
        if task.name not in self._starts:
            # shielded: a producer cancelled while it waits must not cancel the derivation (aclose does)
            result = await asyncio.shield(self._derivation(task))
            self._starts[task.name] = (result.source, None) if isinstance(result, Start) else result.reason
            self._feed()  # taken: the next queued start may be derived
            if isinstance(result, Start):
                return Proposal(code=result.source, proposer="inductor", model="offline",
                                description=result.description, response=result.description)
        start = self._starts[task.name]
        if isinstance(start, str):
            why = f"no offline start for {task.name}: it has no seed kernel, nothing accepted in the archive, and no " \
                  f"TorchInductor start ({start.rstrip('.')})"
        elif start[1] is None:
            # in flight: "exhausted" lets the runner wait for its verdict, which opens the tuning
            return NoProposal(f"{task.name}: waiting for the verdict on its TorchInductor start", "exhausted")
        else:
            verdict = start[1]
            state = f"was rejected ({verdict.status.value}: {verdict.reason[:200]})" if verdict is not None and \
                not verdict.accepted else "is not accepted yet"
            why = f"nothing to tune: {task.name} has no seed kernel and its TorchInductor start {state}"
        return NoProposal(why + "; set KERNFORGE_API_KEY (or MINIMAX_API_KEY) or give --base-url so an LLM can "
                          "write the first kernel", "nothing_to_tune")

    def _unusable_seed(self, task: Task, population: Population) -> NoProposal | None:
        """Why ``task``, with nothing to tune, gets no Inductor start either: its seed was rejected,
        or it cannot run on the CPU. None when it has no such seed."""
        if population.seed_failure is not None:
            verdict = population.seed_failure.verdict
            why = f" ({verdict.status.value}: {verdict.reason[:200]})" if verdict is not None else ""
            return NoProposal(
                f"nothing to tune: {task.name}'s seed kernel was rejected{why} and no other kernel is accepted",
                "nothing_to_tune")
        if task.seed_source is not None and task.interpreter_unsupported:
            # the seed was left out: it cannot run under the interpreter (plan.task_state)
            return NoProposal(
                f"nothing to tune on the CPU: {task.name}'s seed kernel runs on a GPU only "
                f"({task.interpreter_unsupported.rstrip('.')}), and the archive holds no kernel accepted on the CPU "
                "for it. Run it on a GPU machine, or let an LLM write one the Triton interpreter can run "
                "(set KERNFORGE_API_KEY or MINIMAX_API_KEY, or give --base-url)", "nothing_to_tune")
        return None

    async def propose(self, task: Task, population: Population, lessons: Lessons) -> Proposal | NoProposal:
        if self.needs_start(task, population):
            return await self._inductor_start(task)
        parents = population.tunable()
        if not parents:  # and no start needed: the seed says why (never None here)
            return self._unusable_seed(task, population)
        tuner = self._tuner(task)
        reasons: list[NoProposal] = []
        for parent in parents:
            result = tuner.propose(parent.code, parent.verdict)
            if isinstance(result, NoProposal):
                reasons.append(result)
                continue
            return Proposal(code=result.source, proposer="offline", model="offline", parent=parent,
                            description=result.description, response=result.description)
        exhausted = [r for r in reasons if r.kind == "exhausted"]
        if exhausted:
            return exhausted[0]
        return NoProposal(f"{task.name}: {reasons[0].reason}", "nothing_to_tune")


def seed_rng(seed: int, *names: str) -> random.Random:
    """A random stream per purpose, reproducible from the run's --seed."""
    return random.Random(f"{seed}|{'|'.join(names)}")
