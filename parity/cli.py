"""python -m parity golden | check: the command line of the gate.

Exit codes: 0 every stage passed, 1 a stage failed, 2 bad input (arguments, data, checkpoint,
golden, an output folder that cannot be written). Bad input is one line on stderr naming the
problem and the fix, never a traceback, and is found before the long evaluation starts where it
can be (docs/errors.md).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from parity.checks.budgets import BudgetError
from parity.golden import manifest as golden_io
from parity.golden.data import DataError, load_coco, load_dataset
from parity.golden.distributed import DEFAULT_TIMEOUT_S, RankFailure, start, stop
from parity.golden.settings import DataNotFoundError
from parity.golden.store import GoldenError
from parity.report.verdicts import overall_verdict
from parity.tasks.registry import DEFAULT_TASK, TASKS
from parity.tasks.source import ModelSource
from parity.tasks.task import positive_int
from samfast import CheckpointError, InputError, StageError
from samfast.build import built_switches, check_stages
from samfast.checkpoint import resolve_checkpoint
from samfast.families import families_supporting, family_of, model_types
from samfast.stages import LADDER, parse_stages

# bf16 matmuls and convolutions crawl on CPUs without bf16 units (~60 s per vit_tiny image on
# the 2-core CI machine), so the CPU gate runs the fp32-exact switches; bf16 and compile are
# checked on the CPU by the unit layer and in full on the GPU. The fused rel-pos kernel needs CUDA
# (the unit layer runs it under TRITON_INTERPRET=1 against float64 math): on a CPU `fp32+triton` can
# only be NOT EXERCISED, so it is checked when asked for by name.
DEFAULT_CPU_STAGES = ["fp32", "fp32+sdpa", "fp32+nt"]
# The ladder through int8. 2:4 sparsity is asked for by name (SPARSE_WITHOUT_INT8; the ladder's own
# `sparse`, int8 + 2:4, needs an int8 2:4 layout torchao 0.18 no longer has): pruning half of the
# encoder's weights without fine-tuning changes the model, so it misses fp32 by design (trained
# vit_tiny on scenes, H100: mean mask IoU 0.88, predicted-IoU error up to 0.72) and a default gate
# that is always red would teach people to ignore it.
DEFAULT_GPU_STAGES = list(LADDER[:-1])

PROBE_BYTES = 1 << 20  # an output folder must take this much before the evaluation starts


class OutputFolderError(ValueError):
    """A folder the run must write into (--report-dir, --golden-root) cannot be written."""


# The one place where bad input becomes exit 2: every error of the project that means "the input
# is wrong" (not "a stage failed", not "parity has a bug": those keep their traceback).
BAD_INPUT_ERRORS = (
    GoldenError,
    DataNotFoundError,
    DataError,
    CheckpointError,
    StageError,
    InputError,
    OutputFolderError,
    BudgetError,
)


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported in one line (exit 2) instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to 2**32 - 1, got {text!r}")
    return value


def _device(text: str) -> str:
    """cpu, cuda or cuda:N, refused now when this machine cannot run it."""
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device the gate runs on; use cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"{text} asked for, but this machine has no usable CUDA GPU; use --device cpu or leave --device out")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise argparse.ArgumentTypeError(f"{text} asked for, but this machine has {count} GPU(s); use cuda:0 .. cuda:{count - 1}")
    return text


def _stages(text: str) -> str:
    try:
        parse_stages(text)
    except StageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="vit_tiny", choices=model_types(),
                        help="model type, SAM 1 or SAM 2 (default vit_tiny)")
    parser.add_argument("--checkpoint", help="official sam_vit_*.pth, a state dict in that layout, or 'trained' "
                        "(the default for vit_tiny: the small SAM this project trained)")
    parser.add_argument("--seed", type=_seed, help="seeded synthetic weights instead of a checkpoint (their masks "
                        "mean nothing: logits gate, mask IoU is only reported)")
    parser.add_argument("--data", default="scenes", help="coco-mini, scenes (embedded, the default) or a folder")
    parser.add_argument("--coco-root", type=Path, help="folder of COCO images (e.g. coco/val2017); with --ann-file")
    parser.add_argument("--ann-file", type=Path, help="COCO instances json (e.g. instances_val2017.json)")
    parser.add_argument("--limit", type=positive_int, help="first N images by image id")
    parser.add_argument("--prompt", choices=("point", "box"), default="point")
    parser.add_argument("--device", type=_device, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--nproc", type=positive_int, metavar="N",
                        help="share the work among N processes, one per GPU (gloo ranks on a CPU): runs this "
                        "command under `torchrun --standalone --nproc-per-node N`; same golden, same figures")
    parser.add_argument("--collective-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="under torchrun: how long a rank waits for the others at a batch boundary "
                        f"(default {DEFAULT_TIMEOUT_S:g}; longer than the slowest first batch, compile included)")
    parser.add_argument("--task", choices=tuple(TASKS), default=DEFAULT_TASK,
                        help="; ".join(f"{task.name}: {task.help}" for task in TASKS.values()))
    for task in TASKS.values():
        parser.set_defaults(**{f"_flags_of_{task.name}": task.add_arguments(parser)})


def _refuse_other_tasks_flags(args, parser: argparse.ArgumentParser) -> None:
    """A flag of one task given with another is a mistake (exit 2), not silently ignored."""
    for task in TASKS.values():
        given = [f"--{dest.replace('_', '-')}" for dest in getattr(args, f"_flags_of_{task.name}")
                 if getattr(args, dest) is not None]
        if task.name != args.task and given:
            parser.error(f"{', '.join(given)} go with --task {task.name}")


def check_writable(folder: Path, flag: str) -> None:
    """Refuse now, not after the evaluation, a folder that cannot take the run's files (read-only,
    full, a file): create it and write PROBE_BYTES to an unnamed temporary file in it, which
    leaves nothing behind even when the process is killed."""
    if folder.exists() and not folder.is_dir():
        raise OutputFolderError(f"{flag} {folder} is a file, not a folder; pass a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as probe:
            probe.write(bytes(PROBE_BYTES))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        raise OutputFolderError(
            f"{flag} {folder} cannot be written ({err.strerror or err}); pass a writable folder with free space"
        ) from None


def _dataset(args):
    if args.coco_root or args.ann_file:
        return load_coco(args.coco_root, args.ann_file, limit=args.limit), (
            f"--coco-root {shlex.quote(str(args.coco_root))} --ann-file {shlex.quote(str(args.ann_file))}"
            + (f" --limit {args.limit}" if args.limit else ""))
    return load_dataset(args.data, limit=args.limit), f"--data {shlex.quote(str(args.data))}" + (f" --limit {args.limit}" if args.limit else "")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m parity", description=__doc__, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    golden = sub.add_parser("golden", allow_abbrev=False, help="write fp32 golden outputs (to a temporary folder, swapped in whole)")
    _add_common(golden)
    golden.add_argument("--golden-root", type=Path, help="where golden folders live (default: golden/)")
    check = sub.add_parser("check", allow_abbrev=False, help="run stages and compare them with the golden; exit 1 on any failure")
    _add_common(check)
    check.add_argument("--stages", nargs="+", type=_stages, help="ladder names or '+' combinations (default on a GPU: "
                       f"{' '.join(DEFAULT_GPU_STAGES)}; on a CPU: {' '.join(DEFAULT_CPU_STAGES)})")
    check.add_argument("--golden", type=Path, help="golden folder (default: derived from model, checkpoint, data)")
    check.add_argument("--report-dir", type=Path, default=Path("reports"))
    check.add_argument("--require-gpu", action="store_true", help="fail a stage whose switch did not run "
                       "(e.g. the fused kernel fell back, compile ran eagerly) instead of reporting it not exercised")
    args = parser.parse_args(argv)
    command_parser = golden if args.command == "golden" else check
    if bool(args.coco_root) != bool(args.ann_file):
        command_parser.error("--coco-root and --ann-file go together")
    task = TASKS[args.task]
    # a task the families list runs only for those that list it (one no family lists is no family's)
    built_for = [f"{f.name} ({', '.join(f.model_types)})" for f in families_supporting(args.task)]
    if built_for and not (family := family_of(args.model)).supports(args.task):
        command_parser.error(f"--task {args.task} is not built for {family.name} ({args.model}) yet; it gates "
                             + "; ".join(built_for))
    if not task.reads_coco and (args.coco_root or args.limit):
        command_parser.error(f"--task {args.task} reads its own data (--data): --coco-root, --ann-file and --limit "
                             "do not apply to it")
    _refuse_other_tasks_flags(args, command_parser)
    task.validate(args, command_parser)
    if args.nproc is not None and args.nproc != 1:
        return _under_torchrun(args.nproc, sys.argv[1:] if argv is None else list(argv))

    try:  # bad input found before any process group, model or data exists
        source = _model_source(args, command_parser)
        if args.command == "check":
            for stage in args.stages or []:
                check_stages(args.model, stage)
        if args.command == "golden":
            check_writable(args.golden_root or golden_io.GOLDEN_ROOT, "--golden-root")
        else:
            check_writable(args.report_dir, "--report-dir")
    except BAD_INPUT_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # Under torchrun every rank runs this; rank 0 alone writes the golden or the reports.
    ranks, device = start(args.device, args.collective_timeout)
    try:
        return _run(task, args, source, ranks, device)
    except RankFailure as err:
        if ranks.is_main or not err.agreed:  # an agreed failure is said once, by rank 0
            print(f"error: {err}", file=sys.stderr)
        if err.agreed:
            ranks.barrier()  # no rank exits (and gets rank 0 stopped by torchrun) before rank 0 has spoken
        return 2 if err.bad_input else 1
    except BAD_INPUT_ERRORS as err:
        print(f"error{f' (rank {ranks.rank})' if ranks.world_size > 1 else ''}: {err}", file=sys.stderr)
        return 2
    finally:
        stop(ranks)


def _model_source(args, parser: argparse.ArgumentParser):
    """The weights asked for: a checkpoint, seeded weights (--seed), or by default what the gate checks,
    the trained vit_tiny; a published model type has no default weights here (none can be downloaded)."""
    if args.checkpoint and args.seed is not None:
        parser.error("--checkpoint and --seed exclude each other: weights come from a file or from a seed")
    if args.checkpoint or args.seed is None:
        if not args.checkpoint and args.model != "vit_tiny":
            official = family_of(args.model).official_checkpoint.format(model_type=args.model)
            parser.error(f"--model {args.model} needs weights: --checkpoint {official} (the official "
                         "file), or --seed N for seeded synthetic weights (their masks mean nothing)")
        return ModelSource(args.model, resolve_checkpoint(args.checkpoint or "trained", args.model))
    return ModelSource(args.model, None, args.seed)


def _under_torchrun(nproc: int, argv: list[str]) -> int:
    """This command again, without --nproc, as torchrun's N ranks; torchrun's exit code (1 when any
    rank failed: each rank's own code, 2 for bad input, is in torchrun's failure summary)."""
    if "WORLD_SIZE" in os.environ:
        print("error: --nproc under torchrun: torchrun has already started the ranks; drop --nproc", file=sys.stderr)
        return 2
    rest, skip = [], False
    for token in argv:
        if skip or token.startswith("--nproc="):
            skip = False
        elif token == "--nproc":
            skip = True
        else:
            rest.append(token)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "parity", *rest]
    print("+ " + shlex.join(command), file=sys.stderr, flush=True)
    return subprocess.call(command)


def default_stages(model_type: str, device: torch.device) -> list[str]:
    """The stages a check runs unless told: the device's default list, less those the model's family
    has no switch built for (SAM 2 so far: sparse)."""
    stages = DEFAULT_GPU_STAGES if device.type == "cuda" else DEFAULT_CPU_STAGES
    return [stage for stage in stages if parse_stages(stage) <= built_switches(model_type)]


def final_line(results, paths: dict[str, Path]) -> str:
    """The check's last line: its verdict, and the one file to open (the others lie beside it)."""
    failed = [r.stage for r in results if r.blocks]
    return (f"Verdict: {overall_verdict(results)}, {sum(r.passed for r in results)} of {len(results)} stages pass"
            + (f" (failed: {', '.join(failed)})" if failed else "")
            + f"; report: {paths.get('report.html') or paths['report.md']} (the other report files beside it)")


def _run(task, args, source, ranks, device) -> int:
    dataset, data_args = _dataset(args) if task.reads_coco else (None, "")
    if args.command == "golden":
        written = task.make_golden(args, source, dataset, device, ranks)
        if written:
            print(written)
        return 0
    stages = args.stages or default_stages(args.model, device)
    outcome = task.run_check(args, source, dataset, data_args, stages, device, ranks)
    verdict = None
    if outcome:
        results, paths = outcome
        print(paths["report.md"].read_text())
        print(final_line(results, paths))
        verdict = 1 if any(r.blocks for r in results) else 0  # a stage not exercised fails only with --require-gpu
    return ranks.from_main(verdict)  # every rank exits with rank 0's verdict
