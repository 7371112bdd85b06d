"""Base units and the byte sizes of the numeric formats the planner reasons about.

Internal quantities are always base units: bytes, FLOPs, seconds, bytes/second. Catalog files
may use GiB, MiB, GB/s or TFLOP/s; their loaders convert once with these constants.
"""

KIB = 1024
MIB = 1024**2
GIB = 1024**3
GB = 10**9  # decimal gigabyte: datasheet bandwidths and --host-memory-gb
TERA = 10**12  # TFLOP/s -> FLOP/s

#: Bytes per element of each storage format. Source: IEEE 754 (fp32, fp16), bfloat16 and the
#: OCP 8-bit floating point spec (fp8 e4m3/e5m2); int8/uint8 for quantized optimizer states.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "uint8": 1}
