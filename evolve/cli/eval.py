"""`evolve eval PATH`: judge one kernel file against the seed's task."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evaluator import CHIPS
from evaluator import EvalResult
from evolve.cli.common import Command, add_json_alias, one_task, print_json, seed_timing
from evolve.errors import UsageError


def load_seed_arg(name_or_path: str):
    from seeds import SeedError, load_seed

    try:
        return load_seed(name_or_path)
    except SeedError as exc:
        raise UsageError(str(exc)) from None


def task_from_args(args: argparse.Namespace, default_seed: str = "flash_attention", path: str | None = None):
    """The task the shared task flags (cli.common.task_parser) name; what is not given, the defaults
    (``default_seed`` on its seed's default chip). Sets ``args.seed`` and ``args.chip`` to what was used.
    With ``--reference``, the kernel (``path`` or ``--start``) names the entry."""
    from evolve.config import TaskConfig

    reference = one_task(args)
    args.seed = args.seed or default_seed
    config = TaskConfig(seed=args.seed, shape=args.shape, causal=args.causal, dtype=args.dtype, chips=args.chips,
                        start=getattr(args, "start", None), reference=reference, entry=getattr(args, "entry", None),
                        order=getattr(args, "order", None))
    task_class = config.load_seed().task_class
    args.chip = args.chip or task_class.default_chip
    args.memory = getattr(args, "memory", None) or task_class.default_memory_gib or None
    if args.chip not in CHIPS:
        raise UsageError(f"unknown chip {args.chip!r}; use --chip with one of: {', '.join(CHIPS)}")
    if reference and path:
        from evolve.start.resolve import resolve_start

        return config.task(resolve_start(path, config.load_seed(), file=True).source)
    return config.task()


def seed_from_args(args: argparse.Namespace):
    """The seed the task flags name: a reference file's (``--reference``) or ``--seed``'s."""
    from evolve.config import TaskConfig

    return TaskConfig(seed=args.seed, reference=getattr(args, "reference", None)).load_seed()


def start_from_args(args: argparse.Namespace, seed, path: str | None = None):
    """The kernel a command starts from (evolve/start/resolve.py): its FILE argument ``path`` or
    ``--start``, not both; neither: the seed's own kernel."""
    from evolve.start.resolve import resolve_start

    if path and args.start:
        raise UsageError(f"two kernels given ({path} and --start {args.start}); give a FILE or --start, not both")
    return resolve_start(path, seed, file=True) if path else resolve_start(args.start, seed)


def check_tiling(source: str, task) -> None:
    """Refuse at once a shape the kernel's tunables cannot tile (bad input, not a bad kernel); the
    rule is the seed's task's."""
    from mutations import read_tunables

    try:
        consts = read_tunables(source)
    except Exception:  # noqa: BLE001 - an unparsable source is the screen's business
        consts = {}
    problem = task.tiling_problem(consts)
    if problem:
        raise UsageError(problem)


def left_out(source: str, task) -> str | None:
    """The block sizes the search cannot move in ``source`` and why (discovery's ``unfollowed``),
    a whole dimension of an input (not a tunable) left unsaid; None where there are none."""
    from mutations import unfollowed

    try:
        lines = [line for line in unfollowed(source, task) if "a whole dimension" not in line]
    except Exception:  # noqa: BLE001 - a note, never a failure
        return None
    if not lines:
        return None
    return "note: blocks the search cannot move:\n" + "\n".join(f"  {line}" for line in lines)


def tiling_hint(source: str, task) -> str | None:
    """Why a kernel may have failed at this shape: a block size it holds (found by discovery) that
    does not divide a dimension it tiles, so a grid of floor divisions leaves rows unwritten. Said
    after a FAIL_CORRECTNESS, never a refusal (a kernel may pad or mask its last block)."""
    from mutations import parse
    from mutations import discover

    try:
        tunables = discover(parse(source), task).values()
    except Exception:  # noqa: BLE001 - a hint, never a second failure
        return None
    for t in tunables:
        size = next((n for n in t.sizes if t.value < n and n % t.value), None)
        if size is not None:
            return (f"hint: the kernel's {t.name}={t.value} does not divide {size}, a dimension it tiles at "
                    f"this shape; use a shape it divides, or a {t.name} that does ({', '.join(map(str, t.legal))})")
    return None


def format_table(result: EvalResult, path: str, task) -> str:
    d = result.to_dict()
    m = result.metrics

    def fmt(value, unit="", scale=1.0, digits=4):
        return "-" if value is None else f"{value * scale:.{digits}g}{unit}"

    rows = [
        ("kernel", path), ("entry", getattr(task, "entry", None) or "-"), ("task", task.key),
        ("status", d["status"]), ("error", d["error"] or "-"),
        ("timing source", f"{d['timing_source']} (chip {d['chip']}, libtpu {d['libtpu_version']}, "
                          f"jax {d['jax_version']})"),
        ("latency", fmt(m.latency_s, " us", 1e6) + (f" on {m.chips} chips" if (m.chips or 1) > 1 else "")),
        ("reference latency", fmt(m.reference_latency_s, " us", 1e6)
         + (" (the task's XLA program, on one chip)" if getattr(task, "chips", 1) > 1 else "")),
        ("speedup vs reference", fmt(m.speedup_vs_reference, "x", digits=3)),
        ("estimated cycles", "-" if m.estimated_cycles is None else f"{m.estimated_cycles:,}"),
        ("effective TFLOP/s", fmt(m.tflops, digits=3)),
        ("MXU utilisation", fmt(m.mxu_util, "%", 100, 3)),
        ("HBM bandwidth utilisation", fmt(m.hbm_util, "%", 100, 3) + (" per chip" if (m.chips or 1) > 1 else "")),
        ("regime", m.regime or "-"),
        ("VMEM used", "-" if m.vmem_bytes is None else f"{m.vmem_bytes / 1024:.0f} KiB"),
        ("copy trap", "-" if m.copy_trap is None else ("yes" if m.copy_trap else "no")),
        ("max abs error", fmt(m.max_abs_error, digits=3)
         + f" (the task's XLA program: {fmt(m.reference_max_abs_error, digits=3)})"),
        ("jailed trace + export", fmt(m.sandbox_time_s, " s", digits=3)),
        ("compile time", fmt(m.compile_time_s, " s", digits=3)),
        ("correctness run", fmt(m.correctness_time_s, " s", digits=3)),
        ("evaluation wall time", f"{result.wall_time_s:.1f} s"),
    ]
    return _aligned(rows)


def _aligned(rows: list[tuple[str, str]]) -> str:
    """Two columns, the keys padded to the longest."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


NO_VERDICT = "ESTIMATE ONLY: no verdict (correctness not checked; judge it with evolve eval before trusting it)"


def estimate_only(judge, source: str, task, shown: str, start, fmt: str) -> int:
    """``evolve eval --estimate-only``: the kernel's and the XLA program's figures from the
    compiler's estimate, the construct findings the estimate cannot see, and no verdict; 0 when
    the kernel has a figure, 1 when it has none (it did not trace or compile, or the estimate
    cannot see what it does)."""
    timing, findings = judge.estimate_timing(source, task)
    reference, _ = judge.estimate_timing(None, task)
    blind = [f for f in findings if f.get("construct") in judge.timing.blind_spots]
    cycles = None if blind else timing.cycles
    error = timing.error or ("the estimate cannot see: " + "; ".join(
        f"{f['construct']} in {f['where']}" for f in blind) if blind else "")
    ratio = reference.cycles / cycles if cycles and reference.cycles else None
    prov = judge.provenance(task)
    data = {"status": "ESTIMATE_ONLY", "verdict": None, "note": NO_VERDICT, "kernel": shown, "task": task.key,
            "timing_source": prov.timing_source, "chip": prov.chip, "libtpu_version": prov.libtpu_version,
            "estimated_cycles": cycles, "compute_cycles": timing.compute_cycles, "hbm_cycles": timing.hbm_cycles,
            "latency_s": timing.latency_s if cycles else None, "reference_cycles": reference.cycles,
            "reference_latency_s": reference.latency_s, "speedup_vs_reference": ratio, "error": error,
            "start": start.record()}
    if fmt == "json":
        print_json(data, indent=None)
    else:
        def us(value):
            return "-" if value is None else f"{value * 1e6:.4g} us"

        rows = [("kernel", shown), ("task", task.key), ("status", NO_VERDICT), ("error", error or "-"),
                ("timing source", f"{prov.timing_source} (chip {prov.chip}, libtpu {prov.libtpu_version})"),
                ("estimated cycles", f"{cycles:,}" if cycles else "-"),
                ("  compute / HBM floor", f"{timing.compute_cycles:,} / {timing.hbm_cycles:,}"
                 if cycles and timing.compute_cycles and timing.hbm_cycles else "-"),
                ("latency", us(timing.latency_s if cycles else None)),
                ("XLA program", f"{reference.cycles:,} cycles, {us(reference.latency_s)}" if reference.cycles else
                 f"- ({reference.error or 'no figure'})"),
                ("speedup vs XLA program", f"{ratio:.3f}x (estimate only)" if ratio else "-")]
        print(_aligned(rows))
    return 0 if cycles else 1


def _judge_maker(args: argparse.Namespace):
    """The command's judge, made once when first asked for (``args.chip`` set by then)."""
    from evaluator import Judge
    from evolve.config import JudgeSettings

    static = args.timing in (None, "auto") or args.timing.startswith("compiler_estimate")
    if args.estimate_only and not static:
        raise UsageError(f"--estimate-only reads the compiler's estimate; drop --timing {args.timing} "
                         "or judge the kernel in full without --estimate-only")
    made: list = []

    def judge():
        if not made:
            timing = args.timing or seed_timing(seed_from_args(args)) or "auto"
            if args.estimate_only and timing == "auto":
                timing = "compiler_estimate"
            try:
                made.append(Judge(JudgeSettings(chip=args.chip, timing=timing,
                                                memory_gib=args.memory or 0).judge_config()))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        return made[0]
    return judge


def _serve(args: argparse.Namespace, judge_for) -> None:
    """A reference file and no kernel (or ``--start auto``): the built-in seed that serves it best
    becomes ``--start`` (evolve/start/serve.py), the seeds tried printed; UsageError when none does."""
    from evolve.config import TaskConfig
    from evolve.start.serve import serve, served_config, serving_memory, wants_serving

    config = TaskConfig(seed=args.seed or "flash_attention", shape=args.shape, start=args.start,
                        reference=one_task(args), entry=getattr(args, "entry", None))
    if not wants_serving(config):
        return
    if args.estimate_only:
        raise UsageError("--estimate-only gives no verdict, and serving a reference file takes the seed whose "
                         "kernel passes on it; drop --estimate-only, or name the kernel with --start")
    task_class = config.load_seed().task_class
    args.chip = args.chip or task_class.default_chip
    args.memory = args.memory or task_class.default_memory_gib or serving_memory() or None
    found = serve(config, lambda task: lambda source: judge_for().evaluate(source, task),
                  progress=lambda line: print(line, file=sys.stderr, flush=True))
    chosen = served_config(config, found)
    print(found.report(), file=sys.stderr)
    args.start, args.order = chosen.start, chosen.order


class EvalCommand(Command):
    name = "eval"
    help = "judge one kernel file against the seed's task"
    parents = ("format", "task", "timing", "start")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", nargs="?", default=None,
                            help="a kernel file defining the seed's entry point (flash_attention(q, k, v, "
                                 "*, causal, sm_scale) for the default seed); or name it with --start")
        add_json_alias(parser, help="print one JSON object instead of a table (the same as --format json)")
        parser.add_argument("--estimate-only", action="store_true",
                            help="the compiler's estimate of the kernel and of the task's XLA program, "
                                 "with no correctness check: no verdict (for shapes too large to check "
                                 "here; never for crowning), nothing stored")

    def take_action(self, args: argparse.Namespace) -> int:

        if args.path and not Path(args.path).is_file():
            raise UsageError(f"no kernel file at {args.path}; give the path of a Python file that defines "
                             "the task's entry point")
        judge_for = _judge_maker(args)
        if getattr(args, "reference", None) and not args.path:
            _serve(args, judge_for)
        task = task_from_args(args, path=args.path)
        wanted = f"defines the seed's entry point {task.entry}({', '.join(task.input_names)}, ...)"
        if not args.path and not args.start:
            raise UsageError(f"a kernel is required: give the path of a Python file that {wanted}, or "
                             "--start MODULE_OR_FILE")
        start = start_from_args(args, seed_from_args(args), args.path).for_task(task)
        source, shown = start.source, args.path or start.label
        try:
            compile(source, start.path, "exec")
        except (SyntaxError, ValueError) as exc:
            where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
            raise UsageError(f"{shown} is not Python: {getattr(exc, 'msg', exc)}{where}; give the path of a "
                             f"Python file that {wanted}") from None
        check_tiling(source, task)
        note = left_out(source, task)
        if note:
            print(note, file=sys.stderr)
        judge = judge_for()
        if args.estimate_only:
            return estimate_only(judge, source, task, shown, start, args.format)
        result = judge.evaluate(source, task)
        if getattr(args, "reference", None) and (result.error or "").startswith("output shape"):
            raise UsageError(f"the kernel and the reference file's workload disagree: {result.error}; "
                             "make workload return what the kernel does")
        if args.format == "json":
            print_json({**result.to_dict(), "entry": getattr(task, "entry", None), "start": start.record()},
                       indent=None)
        else:
            print(format_table(result, shown, task))
        hint = tiling_hint(source, task) if result.status.value == "FAIL_CORRECTNESS" else None
        if hint:
            print(hint, file=sys.stderr)
        if result.status.value == "CRASH" and "signal" in (result.error or "") and result.stage == "compile":
            gib = judge.config.limits.memory_bytes >> 30
            print(f"note: a compile that outgrows the judged child's {gib} GiB of address space dies this "
                  f"way (libtpu's profile of a large grid can); give it more with --memory GIB", file=sys.stderr)
        return 0 if result.ok else 1


COMMANDS = (EvalCommand,)
