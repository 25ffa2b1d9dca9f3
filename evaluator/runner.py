"""The trusted runner: audits, compiles, checks and times the programs a jailed worker exported.

Run as ``python -m evaluator.runner REQUEST.json`` by the judge, in a fresh process that never
imports candidate code: it rebuilds the worker's traced jaxpr from data (``wire.py``), lowers
it both ways itself (``traced.programs``: the TPU program and the interpret-mode CPU program),
with its own private directory for the compiler's profile dump (``LIBTPU_INIT_ARGS`` is set by
the judge for this process alone). It produces facts (findings of the audit, compiler output,
the program's outputs as files, raw timing samples); the verdict is the judge's.

Request keys: ``mode`` ("candidate" or "reference"), ``program`` (the worker's artifact),
``task`` (the task's fields) and ``task_source`` (its seed's task.py, to rebuild the reference
program from), ``specs`` ([shape, dtype] of each input), ``input_names``, ``topology``,
``on_tpu``, ``inputs`` (input-set directories),
``out_dir``, ``timing`` ({"warmup": n, "iters": n} or null), ``refuse`` (audit constructs that
end the run), ``prune`` (null, or {"estimate_dir": dir, "above_cycles": n}: after the compile,
read the compiler's estimate and, if it is over ``n``, stop before the correctness stage), and for
a per-chip program (``mesh.py``) ``chips`` (the count the worker traced for), ``chip_specs`` (the
task's per-chip inputs for that count) and ``mesh_axis``: the program is then compiled for that many
devices of the topology, checked on as many CPU devices (the judge sets the device count), and
every chip's output is written (``(chips, *out)``).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time

from evaluator.containment.sandbox import Reporter

_VMEM_RE = re.compile(r'"used_scoped_memory_configs":\[(.*?)\]')
_SIZE_RE = re.compile(r'"size":"(\d+)"')
_COPY_RE = re.compile(r"\bcopy(-start)?\(")


class Refused(Exception):
    """The audit found a construct the judge cannot time or trust."""


def _hlo_facts(hlo_text: str, trusted: bool = False) -> dict:
    """What the compiled HLO says (of the task's own XLA program, also each op's matmul FLOPs)."""
    from evaluator.figure.xla_flops import op_flops

    vmem = sum(int(size) for configs in _VMEM_RE.findall(hlo_text) for size in _SIZE_RE.findall(configs))
    return {"vmem_bytes": vmem if _VMEM_RE.search(hlo_text) else None,
            "copy_trap": bool(_COPY_RE.search(hlo_text)),
            "custom_calls": hlo_text.count("tpu_custom_call")} | ({"op_flops": op_flops(hlo_text)} if trusted else {})


def _kernel_traffic(exported, inputs: str | None, names: list, specs: list, grid_bounds=None, prefetch=None):
    """The trusted traffic model's count for the Pallas kernels of ``exported``, its index maps
    evaluated on the values in the directory ``inputs`` (an input set, or the timing input's), or
    on ``prefetch`` (each kernel's prefetch operands as the counting run computed them on that
    set), a dynamic grid walked at ``grid_bounds`` (its sizes counted on that set)."""
    from evaluator.figure.hbm_traffic import Traffic, program_traffic

    value = None if inputs is None else (lambda i: _read_public(inputs, names[i], specs[i][1]))
    return program_traffic(exported, value, grid_bounds, prefetch) if exported is not None else Traffic()


def _hbm_facts(compiled, exported, timing_input: str | None, names: list, specs: list) -> dict:
    """Bytes the program moves through HBM: XLA's cost analysis for its own ops, less what it
    charges for buffers staged in VMEM (evaluator/figure/xla_bytes.py), and the trusted traffic
    model for Pallas kernels (index maps evaluated on the timing input's values)."""
    from evaluator.figure.xla_bytes import xla_hbm_bytes

    try:
        analysis = compiled.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
        xla_bytes = int(float(analysis.get("bytes accessed", 0.0)))
    except Exception:  # noqa: BLE001 - no analysis: the kernels' traffic alone
        xla_bytes = 0
    try:
        xla_bytes = xla_hbm_bytes(xla_bytes, compiled.as_text())
    except Exception:  # noqa: BLE001 - no HLO text: the analysis's figure as it is (never less)
        pass
    traffic = _kernel_traffic(exported, timing_input, names, specs)
    return {"hbm_bytes": xla_bytes + traffic.kernel_bytes,
            "hbm_kernel_bytes": traffic.kernel_bytes,
            "hbm_notes": list(traffic.notes), "hbm_blind": traffic.blind,
            "hbm_data_dependent": traffic.data_dependent, "hbm_estimate_misses": list(traffic.estimate_misses)}


def _read_input(directory: str, name: str, dtype: str):
    from seeds import load_array

    return load_array(f"{directory}/{name}.npy", dtype)


def _read_public(directory: str, name: str, dtype: str):
    """An input of the public timing input, or None (unknown: the traffic model then counts every
    step as a fetch) if it is not one of them (only small integers are: ``ground_truth.py``)."""
    import os

    return _read_input(directory, name, dtype) if os.path.exists(f"{directory}/{name}.npy") else None


def _write_output(path: str, out) -> dict:
    from seeds import save_array

    return save_array(path, out)


def _load_programs(path: str, specs: list, *, cpu: bool, chips: int = 1,
                   constant_budget: int | None = None) -> tuple[dict, object, object]:
    """The TPU (and CPU) program of the worker's traced jaxpr, lowered here, the jaxpr, and what it
    holds as data. For a per-chip program they are chip 0's alone (collectives as stand-ins: what
    the audit reads). Refused before lowering: constants over the budget (``constants.py``) and a
    compiler parameter outside the allow-list (``compiler_params.py``)."""
    import jax

    from evaluator.program import compiler_params, constants, static_loops, traced, wire
    from evaluator.correctness import mesh

    with open(path, "rb") as fh:
        blob = fh.read(wire.MAX_BYTES + 1)
    closed = static_loops.unroll_static(wire.loads(blob))   # every trip counted (static_loops.py)
    avals = [(tuple(a.shape), str(a.dtype)) for a in closed.in_avals]
    if avals != [(shape, str(dtype)) for shape, dtype in specs]:
        per_chip = f" on each of {chips} chips" if chips > 1 else ""
        raise Refused(f"refused: the traced program takes {avals}, not the task's inputs{per_chip} {specs}")
    held = constants.report(closed)
    problem = held.problem(constants.BUDGET_BYTES if constant_budget is None else constant_budget)
    if problem:
        raise Refused(problem)
    compiler_params.check(closed)
    args = tuple(jax.ShapeDtypeStruct(s, d) for s, d in specs)
    remote = mesh.remote_communication(closed.jaxpr)
    if remote:
        raise Refused(f"refused: a kernel talks to another chip itself ({', '.join(remote)} with a device id): "
                      "the ICI model costs XLA collectives only, so that traffic would be free; combine "
                      "across chips with psum, pmax or all_gather outside the kernel")
    if chips > 1 and len(closed.jaxpr.outvars) != 1:
        raise Refused(f"refused: a per-chip program returns one output (the whole result, on every chip), "
                      f"not {len(closed.jaxpr.outvars)}")
    try:
        if chips > 1:
            traced.check(closed)
            found = {"tpu": mesh.chip_export(closed, 0, False, "tpu", args)}
            return found | ({"cpu": mesh.chip_export(closed, 0, True, "cpu", args)} if cpu else {}), closed, held
        programs = traced.programs(closed, args, cpu=cpu)
    except (traced.Refused, mesh.MeshRefused) as exc:
        raise Refused(str(exc)) from exc
    return {"tpu": programs.tpu} | ({"cpu": programs.cpu} if cpu else {}), closed, held


def _mesh_hbm_facts(compiled, closed, first, task, req: dict, specs: list) -> dict:
    """A per-chip program's HBM bytes: XLA's own ops (cost analysis of the partitioned program, one
    chip's) plus the kernels of the busiest chip, each chip's counted on its own share of the timing
    input (its own cache lengths). ``first``: chip 0's export (the audit's), ``specs``: one chip's."""
    import jax

    from evaluator.figure.hbm_traffic import program_traffic
    from evaluator.correctness.mesh import chip_export

    facts = _hbm_facts(compiled, None, None, [], [])
    chips, names, timing_input = int(req["chips"]), req["input_names"], req.get("timing_input")
    args = tuple(jax.ShapeDtypeStruct(s, d) for s, d in specs)
    per_chip, notes, blind = [], [], False
    for chip in range(chips):
        value = None if timing_input is None else (lambda i, c=chip: None if (
            array := _read_public(timing_input, names[i], specs[i][1])) is None else task.chip_split(
            names[i], array, chips)[c])
        exported = first if chip == 0 else chip_export(closed, chip, False, "tpu", args)
        traffic = program_traffic(exported, value)
        per_chip.append(traffic.kernel_bytes)
        notes.extend(f"chip {chip}: {n}" for n in traffic.notes)
        blind = blind or traffic.blind
    return {"hbm_bytes": facts["hbm_bytes"] + max(per_chip), "hbm_kernel_bytes": max(per_chip),
            "per_chip_kernel_bytes": per_chip, "hbm_notes": notes, "hbm_blind": blind}


def _llo_dir():
    """Where libtpu writes its static profiles in this process (the timing source set it)."""
    import os
    from pathlib import Path

    from evaluator.figure.timing.compiler_estimate import DUMP_FLAG

    match = re.search(re.escape(DUMP_FLAG) + r"=(\S+)", os.environ.get("LIBTPU_INIT_ARGS", ""))
    return Path(match.group(1)) if match else None


def _count_trips(closed, counting, counted_sets, device, specs) -> dict:
    """The figure of a kernel whose work depends on its data, counted on every input set
    (``trips.count_figures``), its variants compiled here for the chip."""
    import jax
    from jax.sharding import SingleDeviceSharding

    from evaluator.figure import trips

    llo = _llo_dir()
    if llo is None:
        return {"error": "no static profile directory: the counted figure needs the compiler estimate"}
    args = [jax.ShapeDtypeStruct(s, d, sharding=SingleDeviceSharding(device)) for s, d in specs]
    return trips.count_figures(closed, counting, counted_sets, llo,
                               lambda choice: jax.jit(trips.variant_program(closed, choice)).lower(*args).compile())


def _lower_for_the_chip(req: dict) -> None:
    """Pallas asks the default device which TPU it lowers for when some ops need it (``sign``,
    which floor division lowers through; ragged paged attention has it). Off a TPU host that
    device is the CPU, which it does not know ("Unsupported TPU device kind: cpu"): answer with
    the topology's chip, for this one-chip process."""
    if req["on_tpu"]:
        return
    from evaluator.chips import answer_cpu_as

    answer_cpu_as(_devices(req, 1)[0].device_kind)


def _within(context, fn):
    """``fn`` called inside ``context()`` (a jit lowers at its first call)."""
    def call(*args):
        with context():
            return fn(*args)
    return call


def _devices(req: dict, chips: int, *, cpu: bool = False) -> list:
    """The first ``chips`` devices the program runs on: the host's CPU devices (the interpret-mode
    check), this host's TPU chips, or the topology's devices (the ahead-of-time compile)."""
    import jax

    if cpu:
        devices = jax.devices("cpu")
    elif req["on_tpu"]:
        devices = jax.devices()
    else:
        from jax.experimental import topologies

        devices = topologies.get_topology_desc(topology_name=req["topology"], platform="tpu").devices
    if len(devices) < chips:
        where = "CPU devices" if cpu else ("chips on this host" if req["on_tpu"] else f"devices in {req['topology']}")
        raise Refused(f"refused: a {chips}-chip program needs {chips} {where}; there are {len(devices)}")
    return list(devices)[:chips]


def main(request_path: str) -> int:
    reporter = Reporter()
    with open(request_path) as fh:
        req = json.load(fh)
    specs = [(tuple(shape), str(dtype)) for shape, dtype in req["specs"]]
    names = req["input_names"]
    chips = int(req.get("chips") or 1)

    stage = "load"
    try:
        reporter.stage(stage)
        import jax
        import jax.numpy as jnp
        from jax.sharding import SingleDeviceSharding

        from evaluator.correctness import interpret, precision

        interpret.set_cores(req.get("tensorcores", 1))     # the check runs the grid as the chip's cores do
        if not req["on_tpu"]:       # and computes every dot as the chip's MXU does (precision.py)
            precision.install()

        count = False      # loops and branches on data to count (a candidate's, set below)
        if req["mode"] == "reference":
            from seeds import task_from_source

            tpu_fn = cpu_fn = (reference_task := task_from_source(req["task_source"], req["task"])).reference_program()
        else:
            stage = "lower"
            reporter.stage(stage)
            _lower_for_the_chip(req)
            t0 = time.perf_counter()
            chip_specs = [(tuple(s), str(d)) for s, d in req["chip_specs"]] if chips > 1 else specs
            programs, closed, held = _load_programs(req["program"], chip_specs, cpu=not req["on_tpu"], chips=chips,
                                                    constant_budget=req.get("constant_budget"))
            stage = "audit"
            reporter.stage(stage)
            from evaluator.program.kernel_audit import COUNTED_ON_DATA, audit_exported

            findings = [f for p in programs.values() for f in audit_exported(p)]
            digest = hashlib.sha256(bytes(programs["tpu"].mlir_module_serialized)).hexdigest()
            reporter.send(event="stage_ok", stage=stage,
                          data={"findings": [f.__dict__ for f in findings], "program_sha256": digest,
                                "lower_time_s": time.perf_counter() - t0, "constant_bytes": held.data_bytes,
                                "constant_computed_bytes": held.computed_bytes,
                                # f32 dots the MXU computes in bf16 passes (and so does the check)
                                "reduced_dots": precision.reduced_dots(closed.jaxpr)[:8]})
            if digest in set(req.get("known") or ()):     # judged before: its verdict stands (same.py)
                reporter.send(event="stage_ok", stage="same", data={"program_sha256": digest})
                reporter.send(event="done")
                return 0
            fatal = [f for f in findings if f.construct in set(req["refuse"])]
            if fatal:
                raise Refused("; ".join(f"{f.construct} in {f.where}: {f.detail}" for f in fatal))
            tpu_fn = programs["tpu"].call
            cpu_fn = programs["cpu"].call if "cpu" in programs else None
            # Loops and branches on data: counted on every input set (trips.py), where the
            # estimate is the figure and there are input sets to run them on; and a
            # kernel's own DMAs (below, once the traffic model has read the program).
            count = (chips == 1 and not req["on_tpu"] and bool(req["inputs"]) and req.get("compile", True)
                     and any(f.construct in COUNTED_ON_DATA for f in findings))

        compiled = device = task = None
        if chips > 1:
            from evaluator.correctness import mesh
            from seeds import task_from_source

            task = task_from_source(req["task_source"], req["task"])
            if chips != task.chips:
                raise Refused(f"refused: a program for {chips} chips on a task of {task.chips} chip(s)")
        if chips > 1 and req.get("compile", True):
            stage = "compile"
            reporter.stage(stage)
            devices = _devices(req, chips)
            t0 = time.perf_counter()
            compiled = mesh.mesh_program(closed, devices, req["mesh_axis"], interpret=False).lower(
                *mesh.sharded_specs(chip_specs, devices, req["mesh_axis"])).compile()
            hlo = compiled.as_text()
            with open(f"{req['out_dir']}/hlo.txt", "w") as fh:    # what the ICI model reads
                fh.write(hlo)
            facts = _hlo_facts(hlo) | {"compile_time_s": time.perf_counter() - t0, "trusted": False, "chips": chips}
            facts |= _mesh_hbm_facts(compiled, closed, programs["tpu"], task, req, chip_specs)
            reporter.send(event="stage_ok", stage=stage, data=facts)
        elif req.get("compile", True):   # the reference's figure may come from the judge's cache
            stage = "compile"
            reporter.stage(stage)
            device = _devices(req, 1)[0]
            args = [jax.ShapeDtypeStruct(s, d, sharding=SingleDeviceSharding(device)) for s, d in specs]
            t0 = time.perf_counter()
            compiled = jax.jit(tpu_fn).lower(*args).compile()
            facts = _hlo_facts(compiled.as_text(), trusted=req["mode"] == "reference")
            facts["compile_time_s"] = time.perf_counter() - t0
            facts |= _hbm_facts(compiled, None if req["mode"] == "reference" else programs["tpu"],
                                req.get("timing_input"), names, specs)
            facts["trusted"] = req["mode"] == "reference"   # the task's own XLA program
            reporter.send(event="stage_ok", stage=stage, data=facts)
            # A kernel's own DMAs (an operand left in HBM): counted on every input set (dmas.py).
            count = count or (req["mode"] != "reference" and facts.get("hbm_blind") and not req["on_tpu"]
                              and bool(req["inputs"]))

            prune = None if count else req.get("prune")    # the static figure does not stand for it
            if prune:   # the cascade: a kernel too slow to matter is not checked
                from pathlib import Path

                from evaluator.figure.timing.compiler_estimate import read_cycles

                cycles, _ = read_cycles(Path(prune["estimate_dir"]))
                if cycles is not None and cycles > prune["above_cycles"]:
                    reporter.send(event="stage_ok", stage="prune", data={"cycles": cycles})
                    reporter.send(event="done")
                    return 0

        stage = "correctness"
        reporter.stage(stage)
        t0 = time.perf_counter()
        outputs = []
        if chips > 1:       # every chip's share placed on its device; every chip's output kept
            run_devices = _devices(req, chips, cpu=not req["on_tpu"])
            run = compiled if req["on_tpu"] else mesh.mesh_program(closed, run_devices, req["mesh_axis"],
                                                                   interpret=True)
            if not req["on_tpu"]:       # lowered at its first call: the same grid loop as export's
                from evaluator.correctness.interpret import installed

                run = _within(installed, run)

            def mesh_args(directory):
                return mesh.put_sharded([task.chip_split(n, _read_input(directory, n, d), chips)
                                         for n, (_, d) in zip(names, specs, strict=True)],
                                        run_devices, req["mesh_axis"])
        run_cpu = None if req["on_tpu"] or chips > 1 else jax.jit(cpu_fn)
        counted, counting_fn = [], None
        for i, directory in enumerate(req["inputs"]):
            if chips > 1:
                out = run(*mesh_args(directory))
                jax.block_until_ready(out)
                outputs.append(_write_output(f"{req['out_dir']}/out{i}.npy", out))
                continue
            args = [_read_input(directory, name, d) for name, (_, d) in zip(names, specs, strict=True)]
            if run_cpu is None:
                out = compiled(*[jax.device_put(a, device) for a in args])
            elif count:   # every set's loops, branches and DMAs counted: the figure is the slowest's
                from evaluator.figure import trips
                from evaluator.correctness.interpret import installed

                if counting_fn is None:   # lowered at its first call: the same grid loop as the CPU program's
                    counting = trips.counting_program(closed)
                    counting_fn = _within(installed, jax.jit(counting))
                out, counts = counting_fn(*[jnp.asarray(a) for a in args])
                counted.append(counts)
            else:     # the XLA program of a model-sized check runs unit by unit (seeds/units.py)
                out = (reference_task.on_units if req["mode"] == "reference" else lambda f, a: f(*a))(
                    run_cpu, [jnp.asarray(a) for a in args])
            jax.block_until_ready(out)
            outputs.append(_write_output(f"{req['out_dir']}/out{i}.npy", out))
        reporter.send(event="stage_ok", stage=stage,
                      data={"outputs": outputs, "correctness_time_s": time.perf_counter() - t0,
                            "split_axes": sorted(set(interpret.SPLIT)),
                            # the task's XLA program's f32 dots in bf16 passes: its precision on the chip
                            "reduced_dots": precision.reduced_dots(jax.make_jaxpr(cpu_fn)(
                                *[jax.ShapeDtypeStruct(s, d) for s, d in specs]).jaxpr)[:8]
                            if req["mode"] == "reference" and cpu_fn is not None else []})

        ran = None     # what each set's kernels ran on: grid sizes, prefetch values (figure/dynamic_grid.py)
        if counted:
            stage = "trips"
            reporter.stage(stage)
            trips_facts = _count_trips(closed, counting, counted, device, specs)
            trips_facts.pop("_prefetch", None)
            ran = [(s.get("grid_bounds"), s.pop("_prefetch", None)) for s in trips_facts.get("sets", [])]
            reporter.send(event="stage_ok", stage=stage, data=trips_facts)
            ran = ran if ran and all(p is not None for _, p in ran) and len(ran) == len(req["inputs"]) else None
        if compiled is not None and chips == 1 and (
                ran or (facts.get("hbm_data_dependent") and len(req["inputs"]) > 1)):
            # Index maps that read the data, or a grid whose size is data: every set's traffic,
            # walked on what the set ran on; the figure the slowest's.
            stage = "traffic"
            reporter.stage(stage)
            xla_bytes = facts["hbm_bytes"] - facts["hbm_kernel_bytes"]
            per_set = [_kernel_traffic(programs["tpu"], directory, names, specs, *(ran[i] if ran else ()))
                       for i, directory in enumerate(req["inputs"])]
            data = {"hbm_bytes_per_set": [xla_bytes + t.kernel_bytes for t in per_set]}
            if ran:     # walked on the counted run's values: what the model sees (or not) on them
                data |= {"walked_on_counts": True, "hbm_blind": any(t.blind for t in per_set),
                         "hbm_notes": sorted({n for t in per_set for n in t.notes})}
            reporter.send(event="stage_ok", stage=stage, data=data)

        if req["on_tpu"] and req.get("timing"):
            stage = "timing"
            reporter.stage(stage)
            args = mesh_args(req["inputs"][0]) if chips > 1 else [
                jax.device_put(_read_input(req["inputs"][0], n, d), device)
                for n, (_, d) in zip(names, specs, strict=True)]
            t_stage = time.perf_counter()
            for _ in range(req["timing"]["warmup"]):
                jax.block_until_ready(compiled(*args))
            samples = []
            for _ in range(req["timing"]["iters"]):
                t0 = time.perf_counter()
                jax.block_until_ready(compiled(*args))
                samples.append(time.perf_counter() - t0)
            reporter.send(event="stage_ok", stage=stage,
                          data={"samples_s": samples, "timing_time_s": time.perf_counter() - t_stage})
    except BaseException as exc:  # noqa: BLE001 - everything is reported, nothing escapes
        reporter.error(stage, exc)
        return 1
    reporter.send(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
