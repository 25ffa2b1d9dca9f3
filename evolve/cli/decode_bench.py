"""`evolve decode-bench`: decode kernels over batch sizes and cache lengths (evolve/experiments/decode_bench.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from evolve.cli.common import Command, add_json_alias, print_json
from evolve.errors import UsageError


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise UsageError(f"--{what} must be positive integers separated by commas, e.g. 1,8,32; got {text!r}")
    return values


class DecodeBenchCommand(Command):
    name = "decode-bench"
    help = "decode kernels over batch sizes and cache lengths: latency, tokens/s, HBM use, tokens/s per dollar"
    description = ("The decode seed's XLA reference, naive kernel and (with --ablation) the best kernel of an "
                   "'evolve ablate --format json' output, at every batch size x cache length, timed by the "
                   "judge's estimate (no correctness check at these sizes: the ablation checked the kernel); "
                   "with --chips 1,4, the best 4-chip program (cache split over a v5e 2x2, checked in "
                   "interpret mode on 4 CPU devices), timed with the ICI model for its collectives. "
                   "Writes a table, a PNG plot of tokens/s against cache length, and JSON.")
    parents = ("format",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seed", default="flash_decoding", help="a decode seed (default flash_decoding)")
        parser.add_argument("--chip", default="v5e", help="v5e (default) or v6e")
        parser.add_argument("--shape", default=None,
                            help="the other dimensions, in the seed's grammar (default: the seed's); B and N "
                                 "are set by --batches and --cache-lens")
        parser.add_argument("--batches", default="1,8,32", help="batch sizes (default 1,8,32)")
        parser.add_argument("--cache-lens", default="8192,32768,131072",
                            help="cache lengths (default 8192,32768,131072)")
        parser.add_argument("--chips", default="1,4",
                            help="1, or 1,4 (default): add the best 4-chip kernel of a v5e 2x2 per size")
        parser.add_argument("--ablation", type=Path, default=None,
                            help="an 'evolve ablate --seed flash_decoding --format json' output: its best kernel "
                                 "is replayed at each size")
        parser.add_argument("--price", type=float, default=None,
                            help="USD per chip-hour (default: the chip's public on-demand price, printed "
                                 "with its source and date)")
        parser.add_argument("--out", type=Path, default=Path("decode-bench"),
                            help="where to write decode-bench.md, .png and .json (default ./decode-bench)")
        parser.add_argument("--rpa", action="store_true",
                            help="add JAX's ragged paged attention at its tuned blocks at each size (the "
                                 "ragged_paged_attention seed's peer; its profile needs --chip v6e)")
        add_json_alias(parser, help="print the rows as a JSON array (the same as --format json)")

    def take_action(self, args: argparse.Namespace) -> int:
        from evaluator import Judge
        from evolve.config import JudgeSettings
        from evolve.cli.eval import check_tiling, load_seed_arg
        from evolve.experiments.decode_bench import (PRICES, best_chain, format_table, plot, rows_json,
                                                     run_decode_bench, sized_task)
        from seeds import SeedError

        batches, cache_lens = _ints(args.batches, "batches"), _ints(args.cache_lens, "cache-lens")
        chips = _ints(args.chips, "chips")
        if not set(chips) <= {1, 4} or 1 not in chips:
            raise UsageError(f"--chips must be 1 or 1,4 (the 4-chip rows are read against the 1-chip ones); "
                             f"got {args.chips!r}")
        if args.chip not in PRICES:
            raise UsageError(f"unknown chip {args.chip!r}; use --chip with one of: {', '.join(PRICES)}")
        price = PRICES[args.chip]
        if args.price is not None:
            if not args.price > 0:
                raise UsageError(f"--price must be a positive number of USD per chip-hour, got {args.price}")
            price = dataclasses.replace(price, usd_per_chip_hour=args.price, source="--price", as_of="given")
        seed = load_seed_arg(args.seed)
        try:
            base = seed.task(args.shape)
            for n in cache_lens:            # every size is a task the seed's kernel can tile
                check_tiling(seed.kernel_source, sized_task(base, batches[0], n))
        except (SeedError, ValueError) as exc:
            raise UsageError(f"{exc}") from None
        chain = best_chain(args.ablation) if args.ablation else None
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot write to {args.out} ({exc.strerror or exc}); give another --out") from None
        judge = Judge(JudgeSettings(chip=args.chip, workers=1).judge_config())
        rows = run_decode_bench(judge, seed, base, batches=batches, cache_lens=cache_lens, chain=chain, price=price,
                                progress=lambda key: print(f"decode-bench: {key}", file=sys.stderr),
                                chips=chips, rpa=args.rpa)
        table = format_table(rows, price)
        (args.out / "decode-bench.md").write_text(table + "\n")
        print_to = args.out / "decode-bench.json"
        print_to.write_text(json.dumps(rows_json(rows, price), indent=1))
        sources = " / ".join(dict.fromkeys(f"{r.chips} chip{'s' * (r.chips > 1)}: {r.timing_source}" for r in rows))
        plot(rows, args.out / "decode-bench.png", f"{seed.name} on {args.chip} · {sources} · "
                                                  f"libtpu {rows[0].libtpu_version}")
        if args.format == "json":
            print_json(rows_json(rows, price))
        else:
            print(table)
            print(f"\ntable: {args.out / 'decode-bench.md'}  plot: {args.out / 'decode-bench.png'}  "
                  f"data: {print_to}")
        return 0


COMMANDS = (DecodeBenchCommand,)
