"""How many times each normalization layer reads and writes its input, ours against flax's, counted in
the programs XLA compiles for the backend this runs on.

Usage::

    python benchmarks/passes.py [--shape 128x32x32x64] [--dtype float32] [--rows "BatchNorm p=2"] [--dump DIR]

For every row of ``benchmarks/norms.py`` and each of its three passes (fwd, fwd+bwd, fwd+bwd x), the
jitted candidate is compiled (``jax.jit(f).lower(...).compile().as_text()``) and the top-level
instructions of its entry computation are read: *kernels* counts those that run (fusions, custom calls,
copies, conditionals), *reads* the operands of the input's full size that they take, *writes* the
full-size values they produce. A normalization that XLA fuses as flax's reads its input twice in the
forward pass (statistics, then output); each extra read is a pass over memory that a memory-bound
layer pays in time on a GPU. ``--dump DIR`` also writes each program's text. This counts; it times
nothing (``benchmarks/norms.py`` does).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import jax
import norms
from _timing import machine_lines

NOT_KERNELS = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast")
INSTRUCTION = re.compile(r"\s*(?:ROOT )?%(\S+) = (.+?) ([a-z][\w-]*)\((.*?)\)(?:, |$)")


def entry_counts(hlo_text: str, full_shape: str) -> tuple[int, int, int]:
    """``(kernels, full-size reads, full-size writes)`` of the entry computation of ``hlo_text``."""
    entry = hlo_text[hlo_text.index("ENTRY"):]
    lines = entry[: entry.index("\n}")].split("\n")[1:]
    types: dict[str, str] = {}
    kernels = reads = writes = 0
    for line in lines:
        match = INSTRUCTION.match(line)
        if match is None:
            continue
        name, result_type, op, operands = match.groups()
        types[name] = result_type
        if op in NOT_KERNELS:
            continue
        kernels += 1
        reads += len({o for o in re.findall(r"%([\w.\-]+)", operands) if full_shape in types.get(o, "")})
        writes += result_type.count(full_shape)
    return kernels, reads, writes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=norms.parse_shapes, default=((128, 32, 32, 64),),
                        help="one NxHxWxC input shape (default 128x32x32x64)")
    parser.add_argument("--dtype", type=norms.parse_dtypes, default=("float32",), help="one input dtype")
    parser.add_argument("--rows", type=norms.parse_rows, default=norms.ROWS,
                        help="comma-separated row names of norms.py (default: all)")
    parser.add_argument("--dump", default=None, help="a directory for each compiled program's text")
    args = parser.parse_args(argv)
    if len(args.shape) != 1 or len(args.dtype) != 1:
        parser.error("give one --shape and one --dtype")
    x, cotangent = norms.bench_inputs(args.shape[0], args.dtype[0])
    full_shape = ",".join(map(str, x.shape))
    print("\n".join(machine_lines([f"input: {full_shape} {args.dtype[0]}"])))
    print("\n| layer | pass | kernels ours / flax | reads ours / flax | writes ours / flax |")
    print("|---|---|---|---|---|")
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    for row in args.rows:
        counts = {}
        for side, factory in (("ours", row.ours), ("flax", row.flax)):
            module = factory(x.dtype)
            variables = module.init(jax.random.key(0), x)
            forward, train, input_gradient = norms.passes(module, row.batch_stats)
            programs = (("fwd", forward, (variables, x)), ("fwd+bwd", train, (variables, x, cotangent)),
                        ("fwd+bwd x", input_gradient, (variables, x, cotangent)))
            for kind, fn, fn_args in programs:
                text = fn.lower(*fn_args).compile().as_text()
                counts[side, kind] = entry_counts(text, full_shape)
                if args.dump:
                    name = re.sub(r"[^\w]+", "_", f"{row.name}_{side}_{kind}")
                    with open(os.path.join(args.dump, f"{name}.hlo"), "w") as f:
                        f.write(text)
        for kind in ("fwd", "fwd+bwd", "fwd+bwd x"):
            ours, flax = counts["ours", kind], counts["flax", kind]
            cells = " | ".join(f"{o} / {f}" for o, f in zip(ours, flax, strict=True))
            print(f"| {row.name} | {kind} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
